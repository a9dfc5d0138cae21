//! CloudStack's API throttling (`api.throttling.*`, simulated: an account's calls past the
//! limit of a window are answered 429 before the command runs) seen by the autoscaler: the
//! provider slows down instead of failing. Refresh keeps answering from the snapshots, a
//! scale-up goes through once CloudStack's window passes, nothing is sent twice, and no answer
//! ever says the key was refused. With `--cloudstack-max-rps` below CloudStack's limit the
//! provider is never throttled at all.
//!
//! On paused tokio time: CloudStack's windows, the client's waits, the provider's deadlines
//! and the scale job all run on the test's clock.

use cks_autoscaler_provider::provider::Provider;
use cks_autoscaler_provider::server::{ServeOptions, serve};
use cks_cloudstack::Client;
use cks_proto as pb;
use cks_proto::cloud_provider_client::CloudProviderClient;
use cks_sim::SimHandle;
use cks_testkit::{
    client_config, elapse, fast_settings, sim_config, sim_config_with, start_sim, wait_until,
    with_deadline,
};
use std::time::Duration;
use tonic::transport::Channel;
use tonic::{Code, Status};

const SCALE: &str = "scaleKubernetesCluster";

/// The provider for the simulator's demo cluster, its CloudStack client limited to `max_rps`,
/// serving gRPC on loopback, and a client of it (the autoscaler).
struct Stack {
    sim: SimHandle,
    cluster: String,
    autoscaler: CloudProviderClient<Channel>,
    /// Every failed answer the autoscaler got.
    errors: Vec<Status>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Stack {
    /// CloudStack throttles the key's account from now on (`max` calls per `interval`
    /// window), and another client of the account has just made `used` of this window's.
    async fn throttle_after_others(&self, max: u32, interval: Duration, used: usize) {
        self.sim.configure(|s| {
            s.throttling = true;
            s.throttling_max = max;
            s.throttling_interval = interval;
        });
        let other = Client::new(client_config(&self.sim)).expect("client");
        for _ in 0..used {
            other
                .get_cluster(&self.cluster)
                .await
                .expect("within the limit");
        }
    }

    async fn start(sim: SimHandle, max_rps: Option<f64>) -> Stack {
        let cluster = sim.cluster_id("demo").expect("demo cluster");
        let cs = Client::new(client_config(&sim).with_max_rps(max_rps)).expect("client");
        let provider = Provider::new(cs, fast_settings(&cluster, 1, 10));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(listener, provider, ServeOptions::default(), async {
            let _ = stopped.await;
        }));
        let autoscaler = CloudProviderClient::connect(format!("http://{addr}"))
            .await
            .expect("connect");
        Stack {
            sim,
            cluster,
            autoscaler,
            errors: Vec::new(),
            _stop: stop,
        }
    }

    /// Refresh under a 1 s deadline; its error is kept.
    async fn refresh(&mut self) -> Result<(), Status> {
        let r = self
            .autoscaler
            .refresh(with_deadline(pb::RefreshRequest {}, Duration::from_secs(1)))
            .await
            .map(drop);
        self.keep(r)
    }

    /// NodeGroupIncreaseSize under a 10 s deadline; its error is kept.
    async fn increase(&mut self, delta: i32) -> Result<(), Status> {
        let req = pb::NodeGroupIncreaseSizeRequest {
            delta,
            id: self.cluster.clone(),
        };
        let r = self
            .autoscaler
            .node_group_increase_size(with_deadline(req, Duration::from_secs(10)))
            .await
            .map(drop);
        self.keep(r)
    }

    async fn target(&mut self) -> i32 {
        let req = pb::NodeGroupTargetSizeRequest {
            id: self.cluster.clone(),
        };
        self.autoscaler
            .node_group_target_size(req)
            .await
            .expect("target size (never calls CloudStack)")
            .into_inner()
            .target_size
    }

    fn keep(&mut self, r: Result<(), Status>) -> Result<(), Status> {
        if let Err(s) = &r {
            self.errors.push(s.clone());
        }
        r
    }

    fn size(&self) -> i64 {
        self.sim.cluster_json(&self.cluster)["size"]
            .as_i64()
            .unwrap_or(-1)
    }

    /// `scaleKubernetesCluster` requests CloudStack accepted (received, not throttled).
    fn scale_requests_accepted(&self) -> usize {
        let received = self
            .sim
            .requests()
            .iter()
            .filter(|r| r.command == SCALE)
            .count();
        let throttled = self.sim.throttled().iter().filter(|c| *c == SCALE).count();
        received - throttled
    }

    /// No answer was a refused key or a refused request: a throttled call is UNAVAILABLE,
    /// saying CloudStack throttles the key.
    fn assert_never_refused(&self) {
        for s in &self.errors {
            let message = s.message().to_lowercase();
            assert_eq!(s.code(), Code::Unavailable, "{s:?}");
            for never in ["unauthorized", "rejected the api key", "may not call"] {
                assert!(!message.contains(never), "{s:?}");
            }
            if message.contains("throttled") {
                assert!(message.contains("api.throttling"), "{s:?}");
                assert!(message.contains("--cloudstack-max-rps"), "{s:?}");
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_throttled_key_slows_the_provider_down_and_the_scale_up_goes_through() {
    let sim = start_sim(sim_config()).await;
    let mut stack = Stack::start(sim, None).await;
    stack.refresh().await.expect("first Refresh");
    assert_eq!(stack.target().await, 3);

    // CloudStack starts throttling the key's account (4 calls per 2 s window), and another
    // client of the account (CKS's own autoscaler, the UI) has just made 3 of this window's.
    stack
        .throttle_after_others(4, Duration::from_secs(2), 3)
        .await;

    // The scale-up: its fresh snapshot takes the window's last call, and CloudStack throttles
    // the scaleKubernetesCluster that follows; it is sent again once the window has passed,
    // and accepted. (Should the throttling outlast the provider's patience, the autoscaler
    // hears UNAVAILABLE and asks again, as it would.)
    if stack.increase(1).await.is_err() {
        wait_until("the scale-up asked again is accepted", async || {
            stack.increase(1).await.is_ok()
        })
        .await;
    }
    assert!(
        stack.sim.throttled().iter().any(|c| c == SCALE),
        "the scale request itself was throttled: {:?}",
        stack.sim.throttled()
    );
    assert_eq!(stack.target().await, 4);

    // Now CloudStack throttles every call: Refresh answers from the snapshot all the while.
    stack.sim.configure(|s| s.throttling_max = 0);
    for _ in 0..5 {
        stack
            .refresh()
            .await
            .expect("Refresh served from the snapshot");
        assert_eq!(stack.target().await, 4);
        elapse(Duration::from_secs(1)).await;
    }

    // Throttling as before: the autoscaler keeps calling Refresh until the provider has seen
    // the new worker.
    stack.sim.configure(|s| s.throttling_max = 4);
    wait_until("CloudStack scaled the cluster to 4", async || {
        stack.size() == 4
    })
    .await;
    wait_until("the provider sees the scale-up done", async || {
        let _ = stack.refresh().await;
        stack.target().await == 4 && stack.sim.running_jobs(&stack.cluster) == 0
    })
    .await;
    assert_eq!(stack.size(), 4, "one node asked for, one added");
    assert_eq!(
        stack.scale_requests_accepted(),
        1,
        "sent once, accepted once"
    );
    stack.assert_never_refused();
}

#[tokio::test(start_paused = true)]
async fn throttling_that_outlasts_the_timeout_is_unavailable_and_changes_nothing() {
    let sim = start_sim(sim_config()).await;
    let mut stack = Stack::start(sim, None).await;
    stack.refresh().await.expect("first Refresh");
    // A window far longer than the client's 3 s request timeout, its calls used up.
    stack
        .throttle_after_others(3, Duration::from_secs(60), 3)
        .await;

    let err = stack.increase(1).await.expect_err("throttled throughout");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(
        err.message().contains("throttl"),
        "says CloudStack throttles: {err:?}"
    );
    stack.assert_never_refused();
    // Nothing was accepted, nothing is queued behind the autoscaler's back.
    assert_eq!(stack.scale_requests_accepted(), 0);
    assert_eq!(stack.target().await, 3);
    stack
        .refresh()
        .await
        .expect("Refresh served from the snapshot");

    // Once the window has passed, the autoscaler's next try goes through (or the one after:
    // the provider's other calls may take the new window's first turns).
    elapse(Duration::from_secs(60)).await;
    wait_until("the autoscaler's next try is accepted", async || {
        stack.increase(1).await.is_ok()
    })
    .await;
    wait_until("CloudStack scaled the cluster to 4", async || {
        stack.size() == 4
    })
    .await;
    assert_eq!(stack.scale_requests_accepted(), 1);
}

#[tokio::test(start_paused = true)]
async fn below_cloudstacks_limit_the_provider_is_never_throttled() {
    // CloudStack allows 5 calls per 1 s window; the provider sends at most 4 per second.
    let sim = start_sim(sim_config_with(|c| {
        c.settings.throttling = true;
        c.settings.throttling_max = 5;
        c.settings.throttling_interval = Duration::from_secs(1);
    }))
    .await;
    let mut stack = Stack::start(sim, Some(4.0)).await;
    stack.refresh().await.expect("first Refresh");
    stack.increase(1).await.expect("scale-up accepted");
    wait_until("the provider sees the scale-up done", async || {
        let _ = stack.refresh().await;
        stack.size() == 4
            && stack.target().await == 4
            && stack.sim.running_jobs(&stack.cluster) == 0
    })
    .await;
    // Refresh after Refresh for a while: still never over the limit.
    for _ in 0..20 {
        let _ = stack.refresh().await;
        elapse(Duration::from_millis(100)).await;
    }
    assert!(
        stack.sim.throttled().is_empty(),
        "throttled: {:?}",
        stack.sim.throttled()
    );
    assert_eq!(stack.scale_requests_accepted(), 1);
    stack.assert_never_refused();
}
