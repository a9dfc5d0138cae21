//! Fault injection: what the autoscaler sees (codes, target size, instance status) when
//! CloudStack is slow, fails, drops connections, sends broken JSON, runs jobs that fail or never
//! end, rejects a rotated key, or when the provider itself is killed or frozen mid-job. Every
//! test also checks that nothing is lost or sent twice: the `scaleKubernetesCluster` requests
//! CloudStack received are counted, and a sampler checks that the cluster never has two scale
//! jobs at once.
//!
//! Clock jumps: every timer, snapshot age and deadline of the provider is a monotonic `Instant`,
//! no CloudStack timestamp feeds a decision, and requests are signed without `expires`. The wall
//! clock is read only for the `startdate` of a `listAsyncJobs` search for a running job, which
//! looks 15 minutes further back than the follow limit, so a clock up to 15 minutes ahead of
//! CloudStack's still finds the job; stepping the system clock is not tested. What can
//! happen to a monotonic clock is a sudden gap, when the process is frozen (SIGSTOP, a paused
//! VM or container) while CloudStack goes on: `a_frozen_provider_catches_up_after_a_time_gap`
//! covers that with the real binary.
//!
//! Time: the tests with an in-process provider run on paused tokio time (the simulator, the
//! provider's deadlines, snapshot ages and poll intervals all read that clock), so CloudStack's
//! seconds of latency and the spans a test lets pass cost no wall time and do not depend on
//! the machine's load. The tests of the provider process keep the wall clock (its clock is its
//! own) and wait on conditions.

use cks_autoscaler_provider::provider::{Provider, Settings};
use cks_autoscaler_provider::server::{ServeOptions, serve};
use cks_cloudstack::{Client, ClientConfig};
use cks_proto as pb;
use cks_proto::cloud_provider_client::CloudProviderClient;
use cks_proto::instance_status::InstanceState;
use cks_sim::{self as sim, JobFailure, RecordedRequest, SimConfig, SimHandle};
use cks_testkit::process::{ProviderArgs, ProviderProcess};
use cks_testkit::{
    API_KEY, ProviderServer, SECRET_KEY, WAIT, client_config, elapse, error_of, fast_settings,
    node, provider_sees_down, start_provider, state_of, wait_until, with_deadline,
};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

const SCALE: &str = "scaleKubernetesCluster";

/// Samples the number of running scale jobs of a cluster until dropped.
struct JobSampler {
    max: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl JobSampler {
    fn start(sim: &Arc<SimHandle>, cluster: &str) -> Self {
        let max = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (m, s, sim, cluster) = (max.clone(), stop.clone(), sim.clone(), cluster.to_string());
        tokio::spawn(async move {
            // A sampling period, not a wait: the job count is read every 2 ms of the test's
            // clock for as long as the test runs.
            let mut every = tokio::time::interval(Duration::from_millis(2));
            while !s.load(Ordering::Relaxed) {
                every.tick().await;
                m.fetch_max(sim.running_jobs(&cluster), Ordering::Relaxed);
            }
        });
        JobSampler { max, stop }
    }

    fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }
}

impl Drop for JobSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A simulator, an in-process provider on loopback and a client.
struct Stack {
    sim: Arc<SimHandle>,
    client: CloudProviderClient<Channel>,
    cluster: String,
    jobs: JobSampler,
    server: ProviderServer,
}

impl Stack {
    async fn start(cfg: SimConfig, tweak: impl FnOnce(&mut Settings)) -> Self {
        let sim = Arc::new(sim::spawn(cfg).await.expect("simulator"));
        let cluster = sim.cluster_id("demo").expect("demo cluster");
        let mut settings = fast_settings(&cluster, 1, 10);
        tweak(&mut settings);
        let (server, client) = start_provider(&sim, settings).await;
        let jobs = JobSampler::start(&sim, &cluster);
        let mut s = Stack {
            sim,
            client,
            cluster,
            jobs,
            server,
        };
        s.refresh().await.expect("first refresh");
        s
    }

    async fn refresh(&mut self) -> Result<(), tonic::Status> {
        self.client
            .refresh(with_deadline(pb::RefreshRequest {}, Duration::from_secs(5)))
            .await
            .map(|_| ())
    }

    fn sees_down(&self, id: &str) -> bool {
        provider_sees_down(&self.server.provider, &self.cluster, id)
    }

    async fn target(&mut self) -> Result<i32, tonic::Status> {
        target_of(&mut self.client, &self.cluster).await
    }

    async fn instances(&mut self) -> Vec<pb::Instance> {
        self.client
            .node_group_nodes(with_deadline(
                pb::NodeGroupNodesRequest {
                    id: self.cluster.clone(),
                },
                Duration::from_secs(5),
            ))
            .await
            .expect("NodeGroupNodes")
            .into_inner()
            .instances
    }

    async fn increase(&mut self, delta: i32, deadline: Duration) -> Result<(), tonic::Status> {
        increase(&mut self.client, &self.cluster, delta, deadline).await
    }

    fn scale_requests(&self) -> Vec<RecordedRequest> {
        scale_requests(&self.sim)
    }

    /// The sizes the scale requests CloudStack received asked for, in order.
    fn requested_sizes(&self) -> Vec<String> {
        self.scale_requests()
            .into_iter()
            .map(|r| r.params["size"].clone())
            .collect()
    }

    fn cs_size(&self) -> u64 {
        self.sim.cluster_json(&self.cluster)["size"]
            .as_u64()
            .unwrap_or(0)
    }

    fn cs_state(&self) -> String {
        self.sim.cluster_json(&self.cluster)["state"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Waits for CloudStack to be idle at `size`, then for the provider to report that size.
    async fn settle_at(&mut self, size: u64) {
        let sim = self.sim.clone();
        let cluster = self.cluster.clone();
        wait_until(&format!("CloudStack idle at size {size}"), async || {
            let c = sim.cluster_json(&cluster);
            sim.running_jobs(&cluster) == 0 && c["size"] == size && c["state"] == "Running"
        })
        .await;
        wait_until(
            &format!("the provider's target to match CloudStack's size {size}"),
            async || {
                let _ = self.refresh().await;
                self.target().await.ok() == Some(size as i32)
            },
        )
        .await;
    }
}

pub(crate) async fn target_of(
    c: &mut CloudProviderClient<Channel>,
    id: &str,
) -> Result<i32, tonic::Status> {
    c.node_group_target_size(with_deadline(
        pb::NodeGroupTargetSizeRequest { id: id.to_string() },
        Duration::from_secs(5),
    ))
    .await
    .map(|r| r.into_inner().target_size)
}

pub(crate) async fn increase(
    c: &mut CloudProviderClient<Channel>,
    id: &str,
    delta: i32,
    deadline: Duration,
) -> Result<(), tonic::Status> {
    c.node_group_increase_size(with_deadline(
        pb::NodeGroupIncreaseSizeRequest {
            delta,
            id: id.to_string(),
        },
        deadline,
    ))
    .await
    .map(|_| ())
}

pub(crate) fn scale_requests(sim: &SimHandle) -> Vec<RecordedRequest> {
    sim.requests()
        .into_iter()
        .filter(|r| r.command == SCALE)
        .collect()
}

/// Requests CloudStack carried out: everything but the ones a proxy answered with a 5xx page.
fn executed(reqs: &[RecordedRequest]) -> Vec<&RecordedRequest> {
    reqs.iter()
        .filter(|r| r.fault.as_deref() != Some("error"))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn cloudstack_slower_than_the_deadline_keeps_reads_fast_and_sends_nothing_twice() {
    let mut s = Stack::start(SimConfig::for_tests(API_KEY, SECRET_KEY), |_| {}).await;
    let (wid, wname, _) = s.sim.vms(&s.cluster)[1].clone();
    s.sim.configure(|c| c.latency = Duration::from_millis(3000));

    // Reads come from memory: fast and right although CloudStack takes 3 s per call.
    let t0 = Instant::now();
    assert_eq!(s.target().await.unwrap(), 3);
    assert_eq!(s.instances().await.len(), 3);
    let g = s
        .client
        .node_group_for_node(with_deadline(
            pb::NodeGroupForNodeRequest {
                node: Some(node(&format!("external-cloudstack://{wid}"), &wname)),
            },
            Duration::from_secs(1),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(g.node_group.unwrap().id, s.cluster);
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "three reads took {:?} while CloudStack was slow",
        t0.elapsed()
    );

    // A scale-up cannot get CloudStack's answer within its 2 s deadline: it says so in time.
    let t0 = Instant::now();
    let lost_sent = t0;
    let e = s.increase(1, Duration::from_secs(2)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    assert!(e.message().contains("deadline"), "{}", e.message());
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    // CloudStack may still accept that request, so the next one is queued, not sent.
    let sent = s.scale_requests().len();
    s.increase(1, Duration::from_secs(2))
        .await
        .expect("queued behind the lost answer");
    assert_eq!(s.scale_requests().len(), sent, "nothing sent while unsure");
    // The request CloudStack may have accepted is counted until a snapshot tells.
    assert_eq!(s.target().await.unwrap(), 5);

    // CloudStack recovers. Whether or not it ran the lost request, the provider settles on
    // what CloudStack has, and the cluster grew by at most the one node asked for.
    s.sim.configure(|c| c.latency = Duration::ZERO);
    // Like CloudStack, the simulator runs the request the provider gave up on once its 3 s
    // latency is over (a client hanging up does not cancel a command): that span has to pass
    // for the request to have run, or not, before CloudStack is asked what it did.
    elapse((lost_sent + Duration::from_millis(3500)).saturating_duration_since(Instant::now()))
        .await;
    let sim = s.sim.clone();
    let cluster = s.cluster.clone();
    wait_until("CloudStack idle", async || {
        sim.running_jobs(&cluster) == 0 && sim.cluster_json(&cluster)["state"] == "Running"
    })
    .await;
    let size = s.cs_size();
    assert!(size == 3 || size == 4, "size {size}");
    // The lost submission is settled from the cluster's state (the provider follows it
    // itself); the queued scale-up goes then. Where CloudStack ends depends on whether the
    // lost request had run when `size` was read (under load it may run later): one node for
    // it, one for the queued request.
    wait_until("CloudStack idle after the queued scale-up", async || {
        sim.running_jobs(&cluster) == 0
            && sim.cluster_json(&cluster)["state"] == "Running"
            && s.cs_size() > size
    })
    .await;
    let end = s.cs_size();
    assert!(end == size + 1 || end == 5, "size {end} after {size}");
    s.settle_at(end).await;
    assert_eq!(
        executed(&s.scale_requests()).len() as u64,
        end - 3,
        "every scale request CloudStack ran added one node: nothing was sent twice"
    );
    assert_eq!(s.jobs.max(), 1, "never two scale jobs at once");
}

#[tokio::test(start_paused = true)]
async fn http_5xx_pages_are_unavailable_and_a_retried_scale_up_runs_once() {
    let mut s = Stack::start(SimConfig::for_tests(API_KEY, SECRET_KEY), |_| {}).await;
    s.sim.configure(|c| c.error_rate = 1.0);

    // A recent snapshot is served; the autoscaler's loop goes on.
    s.refresh()
        .await
        .expect("Refresh within the staleness bound");
    assert_eq!(s.target().await.unwrap(), 3);
    let e = s.increase(1, Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    assert!(e.message().contains("HTTP 50"), "{}", e.message());
    assert!(!e.message().contains(SECRET_KEY), "{}", e.message());
    // Nothing ran (this proxy answered instead of passing the request on), but a 504 can also
    // come after CloudStack ran it: the answer counts as lost, settled by reading CloudStack.
    assert!(executed(&s.scale_requests()).is_empty());
    assert_eq!(
        s.target().await.unwrap(),
        4,
        "an unknown outcome shows in the target until CloudStack is read"
    );
    // CloudStack answers again and shows no job: the request never ran, and the target and
    // instances say so; nothing was sent again meanwhile.
    s.sim.configure(|c| c.error_rate = 0.0);
    wait_until("the lost answer to be settled", async || {
        let _ = s.refresh().await;
        s.target().await.ok() == Some(3)
    })
    .await;
    assert!(
        s.instances()
            .await
            .iter()
            .all(|i| state_of(i) == InstanceState::InstanceRunning)
    );
    assert_eq!(s.scale_requests().len(), 1);

    // Half the requests fail: the autoscaler retries until one is accepted.
    s.sim.configure(|c| c.error_rate = 0.5);
    let mut attempts = 0;
    loop {
        attempts += 1;
        match s.increase(1, Duration::from_secs(5)).await {
            Ok(()) => break,
            Err(e) => {
                assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
                assert!(attempts < 100, "never accepted");
            }
        }
    }
    assert_eq!(s.target().await.unwrap(), 4);
    s.sim.configure(|c| c.error_rate = 0.0);
    s.settle_at(4).await;
    let ran = s.scale_requests();
    assert_eq!(executed(&ran).len(), 1, "one scale-up ran: {ran:?}");
    assert_eq!(s.jobs.max(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_answer_to_a_scale_up_is_adopted_not_repeated() {
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    cfg.settings.job_duration = Duration::from_millis(800);
    let mut s = Stack::start(cfg, |_| {}).await;
    s.sim.configure(|c| c.drop_rate = 1.0);
    s.refresh().await.expect("a recent snapshot is served");
    assert_eq!(s.target().await.unwrap(), 3);

    let e = s.increase(1, Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    // CloudStack ran it: the connection was closed after the command.
    let sim = s.sim.clone();
    let cluster = s.cluster.clone();
    wait_until("the job to start", async || sim.running_jobs(&cluster) == 1).await;

    s.sim.configure(|c| c.drop_rate = 0.0);
    // The next refresh finds the cluster Scaling and adopts the job: the requested node shows.
    s.refresh().await.unwrap();
    assert_eq!(s.target().await.unwrap(), 4);
    // Another scale-up waits for that job and is sent after it.
    s.increase(1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(s.target().await.unwrap(), 5);
    assert_eq!(
        s.scale_requests().len(),
        1,
        "nothing sent while the job runs"
    );
    s.settle_at(5).await;
    assert_eq!(s.requested_sizes(), ["4", "5"]);
    assert_eq!(s.jobs.max(), 1);
}

/// A proxy's 504 may come after CloudStack carried the request out (the proxy's read timeout
/// ran out first): the outcome is unknown, settled by reading CloudStack, never taken for a
/// refusal. Taken for one, the scale-up would be reported as a failed creation while
/// CloudStack adds the node, and a removal's caller would hear an error while CloudStack
/// removes the node.
#[tokio::test(start_paused = true)]
async fn a_proxy_504_after_cloudstack_ran_the_request_is_settled_by_reading_cloudstack() {
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    cfg.settings.job_duration = Duration::from_millis(800);
    let mut s = Stack::start(cfg, |_| {}).await;
    s.sim.configure(|c| c.late_error_rate = 1.0);

    let e = s.increase(1, Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    assert!(e.message().contains("HTTP 504"), "{}", e.message());
    let sim = s.sim.clone();
    let cluster = s.cluster.clone();
    wait_until("the job CloudStack started", async || {
        sim.running_jobs(&cluster) == 1
    })
    .await;
    s.sim.configure(|c| c.late_error_rate = 0.0);
    s.refresh().await.unwrap();
    assert_eq!(s.target().await.unwrap(), 4, "the job is adopted");
    s.settle_at(4).await;
    assert_eq!(s.scale_requests().len(), 1, "nothing sent twice");
    let failed: Vec<_> = s
        .instances()
        .await
        .into_iter()
        .filter(|i| error_of(i).is_some())
        .collect();
    assert!(failed.is_empty(), "no failed creation: {failed:?}");

    // A removal: its caller is promised the node's removal, which CloudStack carries out;
    // an error would have the autoscaler untaint a node CloudStack is removing.
    let (wid, wname, _) = s.sim.vms(&s.cluster)[1].clone();
    s.sim.configure(|c| c.late_error_rate = 1.0);
    let mut d = tonic::Request::new(pb::NodeGroupDeleteNodesRequest {
        nodes: vec![node(&format!("external-cloudstack://{wid}"), &wname)],
        id: s.cluster.clone(),
    });
    d.set_timeout(Duration::from_secs(5));
    s.client
        .node_group_delete_nodes(d)
        .await
        .expect("an unknown outcome is not a refusal: the removal is promised");
    s.sim.configure(|c| c.late_error_rate = 0.0);
    s.settle_at(3).await;
    assert!(s.sim.vms(&s.cluster).iter().all(|v| v.0 != wid));
    assert_eq!(s.scale_requests().len(), 2, "nothing sent twice");
    assert_eq!(s.jobs.max(), 1);
}

#[tokio::test(start_paused = true)]
async fn truncated_json_is_unavailable_until_cloudstack_answers_whole() {
    // First with no snapshot at all.
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    cfg.settings.malformed_rate = 1.0;
    cfg.settings.job_duration = Duration::from_millis(800);
    let sim = Arc::new(sim::spawn(cfg).await.unwrap());
    let cluster = sim.cluster_id("demo").unwrap();
    let (server, mut client) = start_provider(&sim, fast_settings(&cluster, 1, 10)).await;
    let addr = server.addr;
    let e = client
        .refresh(with_deadline(pb::RefreshRequest {}, Duration::from_secs(5)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable);
    assert!(e.message().contains("cannot read"), "{}", e.message());
    let e = target_of(&mut client, &cluster).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    let e = increase(&mut client, &cluster, 1, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    assert!(scale_requests(&sim).is_empty());
    assert_eq!(health(addr).await, 2, "NOT_SERVING without a snapshot");
    assert_eq!(
        server_health(addr).await,
        1,
        "ready all the same: CloudStack's state never takes the provider out of its Service"
    );

    // CloudStack answers whole again: serving, once the provider's own retry (within its
    // backoff) has read it; a Refresh during the backoff starts no round of its own.
    sim.configure(|c| c.malformed_rate = 0.0);
    wait_until("Refresh OK again", async || {
        client
            .refresh(with_deadline(pb::RefreshRequest {}, Duration::from_secs(5)))
            .await
            .is_ok()
    })
    .await;
    assert_eq!(target_of(&mut client, &cluster).await.unwrap(), 3);
    wait_until("health SERVING", async || health(addr).await == 1).await;

    // A truncated answer to a scale-up: CloudStack ran it; the provider adopts, not repeats.
    let jobs = JobSampler::start(&sim, &cluster);
    sim.configure(|c| c.malformed_rate = 1.0);
    let e = increase(&mut client, &cluster, 1, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    sim.configure(|c| c.malformed_rate = 0.0);
    wait_until("CloudStack idle at size 4", async || {
        client
            .refresh(with_deadline(pb::RefreshRequest {}, Duration::from_secs(5)))
            .await
            .unwrap();
        let c = sim.cluster_json(&cluster);
        c["size"] == 4 && c["state"] == "Running" && sim.running_jobs(&cluster) == 0
    })
    .await;
    wait_until("the target to be 4", async || {
        if target_of(&mut client, &cluster).await.unwrap() == 4 {
            return true;
        }
        client
            .refresh(with_deadline(pb::RefreshRequest {}, Duration::from_secs(5)))
            .await
            .unwrap();
        false
    })
    .await;
    assert_eq!(scale_requests(&sim).len(), 1, "not repeated");
    assert_eq!(jobs.max(), 1);
}

/// gRPC health of the CloudProvider service (every snapshot within the staleness bound):
/// 1 SERVING, 2 NOT_SERVING.
async fn health(addr: SocketAddr) -> i32 {
    health_of(
        addr,
        "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider",
    )
    .await
}

/// gRPC health of the whole server (readiness, as `/readyz`): 1 SERVING, 2 NOT_SERVING.
async fn server_health(addr: SocketAddr) -> i32 {
    health_of(addr, "").await
}

async fn health_of(addr: SocketAddr, service: &str) -> i32 {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(ch)
        .check(HealthCheckRequest {
            service: service.to_string(),
        })
        .await
        .unwrap()
        .into_inner()
        .status
}

#[tokio::test(start_paused = true)]
async fn a_partly_failed_scale_up_reports_its_instances_as_failed_creations_and_is_not_retried() {
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    cfg.settings.job_failure = JobFailure::Partial;
    // The job fails half-way, well after the RPC returned, as provisioning failures do.
    cfg.settings.job_duration = Duration::from_millis(2000);
    let mut s = Stack::start(cfg, |_| {}).await;
    s.increase(2, Duration::from_secs(5)).await.unwrap();
    assert_eq!(s.target().await.unwrap(), 5);
    let sim = s.sim.clone();
    let cluster = s.cluster.clone();
    wait_until("the job to fail", async || {
        sim.running_jobs(&cluster) == 0 && sim.cluster_json(&cluster)["state"] == "Alert"
    })
    .await;
    let mut failed: Vec<pb::Instance> = Vec::new();
    wait_until("the two failed instances to show", async || {
        s.refresh().await.unwrap();
        failed = s
            .instances()
            .await
            .into_iter()
            .filter(|i| i.status.as_ref().is_some_and(|st| st.error_info.is_some()))
            .collect();
        failed.len() == 2
    })
    .await;
    for i in &failed {
        assert_eq!(state_of(i), InstanceState::InstanceCreating, "{i:?}");
        let e = i.status.as_ref().unwrap().error_info.as_ref().unwrap();
        assert_eq!(e.error_code, "scale-up-failed", "{e:?}");
        assert!(e.error_message.contains("unable to provision"), "{e:?}");
    }
    // CloudStack did not update its size; the failed instances still count until the
    // autoscaler deletes them.
    assert_eq!(s.cs_size(), 3);
    assert_eq!(s.target().await.unwrap(), 5);
    // Nothing retries the failed job behind the autoscaler's back: half a second of
    // refreshes (a span, as the assertion is that nothing happens in it).
    for _ in 0..5 {
        elapse(Duration::from_millis(100)).await;
        s.refresh().await.unwrap();
    }
    assert_eq!(s.scale_requests().len(), 1);
    assert_eq!(s.jobs.max(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_job_that_never_ends_blocks_further_jobs_and_keeps_the_target() {
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    cfg.settings.job_failure = JobFailure::Never;
    cfg.settings.job_duration = Duration::from_millis(100);
    let mut s = Stack::start(cfg, |p| p.job_max_follow = Duration::from_millis(500)).await;
    s.increase(1, Duration::from_secs(5)).await.unwrap();
    let increased = Instant::now();
    assert_eq!(s.target().await.unwrap(), 4);
    // A second request queues behind the job; cancelling it works; the running job's node is
    // not cancelled: asking for it is refused and the target stays.
    s.increase(1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(s.target().await.unwrap(), 5);
    let dec = |delta| {
        with_deadline(
            pb::NodeGroupDecreaseTargetSizeRequest {
                delta,
                id: s.cluster.clone(),
            },
            Duration::from_secs(5),
        )
    };
    let (r1, r2) = (dec(-1), dec(-1));
    s.client.node_group_decrease_target_size(r1).await.unwrap();
    assert_eq!(s.target().await.unwrap(), 4);
    let refused = s.client.node_group_decrease_target_size(r2).await;
    assert_eq!(
        refused.map_err(|e| e.code()).err(),
        Some(tonic::Code::FailedPrecondition)
    );
    assert_eq!(s.target().await.unwrap(), 4);
    // Past the follow limit (500 ms) the job stays the cluster's operation: the target never
    // falls back to CloudStack's size, the job is never searched for again through
    // listAsyncJobs, and it is polled 30 times less often (every 600 ms instead of 20 ms).
    // Spans: the follow limit has to pass, then 1.5 s of refreshes is watched.
    elapse(Duration::from_millis(900).saturating_sub(increased.elapsed())).await;
    s.sim.reset_requests();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1500) {
        s.refresh().await.unwrap();
        assert_eq!(s.target().await.unwrap(), 4, "the target never flaps");
        elapse(Duration::from_millis(100)).await;
    }
    let requests = s.sim.requests();
    assert!(
        !requests.iter().any(|r| r.command == "listAsyncJobs"),
        "the job was never dropped and adopted again"
    );
    let polls = requests
        .iter()
        .filter(|r| r.command == "queryAsyncJobResult")
        .count();
    assert!(
        polls <= 4,
        "{polls} polls in 1.5 s: the job is polled every 600 ms past the follow limit"
    );
    // A scale-up still queues behind it, and nothing is sent.
    s.increase(1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(s.target().await.unwrap(), 5);
    assert_eq!(
        s.scale_requests().len(),
        0,
        "nothing sent while the job runs"
    );
    assert_eq!(s.cs_state(), "Scaling");
    assert_eq!(s.jobs.max(), 1);
}

/// The instances NodeGroupNodes reports with an error.
fn with_errors(instances: &[pb::Instance]) -> Vec<&pb::Instance> {
    instances
        .iter()
        .filter(|i| i.status.as_ref().is_some_and(|st| st.error_info.is_some()))
        .collect()
}

/// Start times (sim ms) of the `listKubernetesClusters` calls CloudStack received.
fn cluster_fetches(sim: &SimHandle) -> Vec<u64> {
    sim.requests()
        .into_iter()
        .filter(|r| r.command == "listKubernetesClusters")
        .map(|r| r.atms)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn refresh_answers_within_its_deadline_from_a_recent_snapshot_while_cloudstack_is_slower() {
    let mut s = Stack::start(SimConfig::for_tests(API_KEY, SECRET_KEY), |_| {}).await;
    let (wid, _, _) = s.sim.vms(&s.cluster)[1].clone();
    s.sim.configure(|c| c.latency = Duration::from_millis(2000));
    s.sim.reset_requests();
    // A worker goes down; CloudStack takes 2 s to say so, the autoscaler waits 1 s per Refresh.
    assert!(s.sim.stop_vm(&wid));
    for _ in 0..3 {
        let t0 = Instant::now();
        s.client
            .refresh(with_deadline(pb::RefreshRequest {}, Duration::from_secs(1)))
            .await
            .expect("Refresh answers OK from a snapshot within the staleness bound");
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "answered after {:?}",
            t0.elapsed()
        );
    }
    // The fetch went on after the deadline and installed its result: the stopped VM shows
    // without another Refresh.
    wait_until("the slow fetch to be installed", async || s.sees_down(&wid)).await;
    // Refreshes arriving while a fetch runs wait for it rather than fetching again: the
    // 2-second calls never overlapped.
    let fetches = cluster_fetches(&s.sim);
    assert!(!fetches.is_empty() && fetches.len() <= 2, "{fetches:?}");
    for pair in fetches.windows(2) {
        assert!(
            pair[1] - pair[0] >= 1900,
            "overlapping fetches: {fetches:?}"
        );
    }
    assert_eq!(s.target().await.unwrap(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_refresh_the_client_gives_up_on_still_installs_its_fetch_once() {
    let mut s = Stack::start(SimConfig::for_tests(API_KEY, SECRET_KEY), |_| {}).await;
    let (wid, _, _) = s.sim.vms(&s.cluster)[1].clone();
    s.sim.configure(|c| c.latency = Duration::from_millis(1500));
    s.sim.reset_requests();
    assert!(s.sim.stop_vm(&wid));
    // The client cancels the call (the RPC future is dropped on the server) while the fetch
    // is in flight.
    let cancelled = tokio::time::timeout(
        Duration::from_millis(200),
        s.client
            .refresh(with_deadline(pb::RefreshRequest {}, Duration::from_secs(5))),
    )
    .await;
    assert!(cancelled.is_err(), "the call was cut off: {cancelled:?}");
    // The fetch is not lost half-way: it ends and installs the whole snapshot, with no other
    // Refresh, and once.
    wait_until(
        "the fetch of the cancelled Refresh to be installed",
        async || s.sees_down(&wid),
    )
    .await;
    assert_eq!(cluster_fetches(&s.sim).len(), 1);
    assert_eq!(s.instances().await.len(), 3);
    assert_eq!(s.target().await.unwrap(), 3);
    s.sim.configure(|c| c.latency = Duration::ZERO);
    s.refresh().await.unwrap();
    assert!(s.sees_down(&wid));
}

#[tokio::test(start_paused = true)]
async fn refresh_is_unavailable_before_its_deadline_without_a_recent_snapshot() {
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    cfg.settings.latency = Duration::from_millis(2000);
    let sim = Arc::new(sim::spawn(cfg).await.unwrap());
    let cluster = sim.cluster_id("demo").unwrap();
    let mut settings = fast_settings(&cluster, 1, 10);
    settings.staleness_bound = Duration::from_millis(1500);
    let (_server, mut client) = start_provider(&sim, settings).await;

    // No snapshot yet: UNAVAILABLE, in time, naming the group and why.
    let t0 = Instant::now();
    let e = client
        .refresh(with_deadline(pb::RefreshRequest {}, Duration::from_secs(1)))
        .await
        .unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    for part in [cluster.as_str(), "no snapshot yet", "deadline"] {
        assert!(e.message().contains(part), "{part:?} in {}", e.message());
    }
    // The fetch went on; once it is in, Refresh answers OK within its deadline.
    wait_until("Refresh to answer OK", async || {
        client
            .refresh(with_deadline(pb::RefreshRequest {}, Duration::from_secs(1)))
            .await
            .is_ok()
    })
    .await;
    assert_eq!(target_of(&mut client, &cluster).await.unwrap(), 3);

    // CloudStack goes on answering in 2 s; left alone for longer than the staleness bound,
    // the snapshot is too old to serve and the next Refresh says so in time.
    // A span: the last fetch started by the wait above is installed within 2 s; 4 s later the
    // snapshot is at least 2 s old, past the 1.5 s bound.
    elapse(Duration::from_millis(4000)).await;
    let t0 = Instant::now();
    let e = client
        .refresh(with_deadline(pb::RefreshRequest {}, Duration::from_secs(1)))
        .await
        .unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    assert!(e.message().contains("old"), "{}", e.message());
}

#[tokio::test(start_paused = true)]
async fn a_scale_up_failing_part_way_inside_the_watch_answers_ok_with_failed_instances() {
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    cfg.settings.job_failure = JobFailure::Partial;
    // The job creates its VMs and fails 150 ms in, while IncreaseSize still watches it.
    cfg.settings.job_duration = Duration::from_millis(300);
    let mut s = Stack::start(cfg, |p| p.scale_watch = Duration::from_millis(1500)).await;
    s.increase(2, Duration::from_secs(5))
        .await
        .expect("OK: the autoscaler learns of the failure from the failed instances");
    // IncreaseSize answered once the job was past validation (the cluster Scaling); the
    // failure comes later, and the follower reports it.
    wait_until("the follower to report the failed job", async || {
        s.sim.running_jobs(&s.cluster) == 0 && with_errors(&s.instances().await).len() == 2
    })
    .await;
    assert_eq!(s.cs_state(), "Alert");
    assert_eq!(s.cs_size(), 3);
    // Without a Refresh: the job's two VMs are failed creations, as the follower reports them,
    // and count in the target until the autoscaler deletes them.
    let instances = s.instances().await;
    assert_eq!(instances.len(), 5, "{instances:?}");
    let failed = with_errors(&instances);
    assert_eq!(failed.len(), 2, "{instances:?}");
    for i in &failed {
        assert_eq!(state_of(i), InstanceState::InstanceCreating, "{i:?}");
        let e = i.status.as_ref().unwrap().error_info.as_ref().unwrap();
        assert_eq!(e.error_code, "scale-up-failed", "{e:?}");
        assert!(e.error_message.contains("unable to provision"), "{e:?}");
    }
    assert_eq!(s.target().await.unwrap(), 5);
    // The same after refreshes, and nothing retries the job (a span of refreshes, as the
    // assertion is that nothing happens in it).
    for _ in 0..3 {
        s.refresh().await.unwrap();
        elapse(Duration::from_millis(50)).await;
    }
    assert_eq!(with_errors(&s.instances().await).len(), 2);
    assert_eq!(s.target().await.unwrap(), 5);
    assert_eq!(s.scale_requests().len(), 1);
    assert_eq!(s.jobs.max(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_scale_up_refused_inside_the_watch_fails_and_changes_nothing() {
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    cfg.settings.job_failure = JobFailure::Capacity;
    let mut s = Stack::start(cfg, |p| p.scale_watch = Duration::from_millis(1500)).await;
    let e = s.increase(2, Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert!(
        e.message().contains("insufficient capacity"),
        "CloudStack's text: {}",
        e.message()
    );
    assert_eq!(s.target().await.unwrap(), 3);
    let instances = s.instances().await;
    assert_eq!(instances.len(), 3);
    assert!(with_errors(&instances).is_empty(), "{instances:?}");
    s.refresh().await.unwrap();
    assert_eq!(s.target().await.unwrap(), 3);
    assert_eq!((s.cs_size(), s.cs_state().as_str()), (3, "Running"));
    assert_eq!(s.scale_requests().len(), 1);
    // Nothing is left in flight: the next scale-up goes out at once.
    s.sim.configure(|c| c.job_failure = JobFailure::None);
    s.increase(1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(s.scale_requests().len(), 2);
    s.settle_at(4).await;
    assert_eq!(s.jobs.max(), 1);
}

#[tokio::test(start_paused = true)]
async fn adopting_a_running_job_reads_no_job_list() {
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    cfg.settings.job_duration = Duration::from_millis(3000);
    let mut s = Stack::start(cfg, |_| {}).await;
    // A day's job history: 3,000 finished jobs, six pages of 500.
    s.sim
        .add_past_jobs(&s.cluster, 3000, Duration::from_secs(20 * 3600));
    s.increase(1, Duration::from_secs(5)).await.unwrap();
    // The provider forgets the job (Cleanup, as after a restart): the next Refresh finds the
    // cluster Scaling with no job known. Scale jobs name no cluster and listAsyncJobs lists
    // every job of the account, so none could be proven this cluster's: the cluster is
    // followed through its state, without reading the job history.
    s.client.cleanup(pb::CleanupRequest {}).await.unwrap();
    s.sim.reset_requests();
    s.refresh().await.unwrap();
    assert_eq!(
        s.target().await.unwrap(),
        4,
        "the running job's VM is counted"
    );
    assert!(
        !s.sim
            .requests()
            .iter()
            .any(|r| r.command == "listAsyncJobs"),
        "no job search"
    );
    s.settle_at(4).await;
    assert_eq!(s.scale_requests().len(), 0, "nothing sent again");
    assert_eq!(s.jobs.max(), 1);
}

/// A provider for `sim`'s cluster, with the given CloudStack client settings.
async fn provider_with(
    cc: ClientConfig,
    settings: Settings,
) -> (
    CloudProviderClient<Channel>,
    SocketAddr,
    tokio::sync::oneshot::Sender<()>,
) {
    let provider = Provider::new(Client::new(cc).unwrap(), settings);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(listener, provider, ServeOptions::default(), async {
        let _ = rx.await;
    }));
    let client = CloudProviderClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    (client, addr, tx)
}

#[tokio::test(start_paused = true)]
async fn a_wrong_secret_is_a_refused_key_named_without_leaking_keys() {
    let sim = sim::spawn(SimConfig::for_tests(API_KEY, SECRET_KEY))
        .await
        .unwrap();
    let cluster = sim.cluster_id("demo").unwrap();
    let mut cc = client_config(&sim);
    cc.secret_key = "a-wrong-secret".into();
    let (mut client, addr, _stop) = provider_with(cc, fast_settings(&cluster, 1, 10)).await;
    // The key's refusal, not an outage: waiting does not mend it.
    let e = client.refresh(pb::RefreshRequest {}).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
    for says in [
        "rejected the API key",
        "CloudStack refused this provider's API key",
    ] {
        assert!(e.message().contains(says), "{says}: {}", e.message());
    }
    for secret in ["a-wrong-secret", SECRET_KEY] {
        assert!(!e.message().contains(secret), "{}", e.message());
    }
    let e = target_of(&mut client, &cluster).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
    // A scale request without any snapshot is refused by the machine before CloudStack is
    // asked (the autoscaler never sends one: its loop stops at the failed Refresh).
    let e = increase(&mut client, &cluster, 1, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    assert_eq!(health(addr).await, 2);
    assert!(scale_requests(&sim).is_empty());
}

#[tokio::test(start_paused = true)]
async fn after_a_key_rotation_scale_requests_are_permission_denied_and_run_nothing() {
    let first = sim::spawn(SimConfig::for_tests(API_KEY, SECRET_KEY))
        .await
        .unwrap();
    let sim_addr = first.addr;
    let cluster = first.cluster_id("demo").unwrap();
    let cc = client_config(&first);
    let mut settings = fast_settings(&cluster, 1, 10);
    settings.staleness_bound = Duration::from_millis(1500);
    let (mut client, addr, _stop) = provider_with(cc.clone(), settings).await;
    client.refresh(pb::RefreshRequest {}).await.unwrap();
    let fetched = Instant::now();

    // CloudStack comes back on the same address with the same cluster but new keys.
    first.shutdown().await;
    let rotated = SimConfig::for_tests("rotated-key", "rotated-secret");
    let listener = tokio::net::TcpListener::bind(sim_addr).await.unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sim::serve(listener, rotated, async {
        let _ = stop_rx.await;
    }));
    let admin = Client::new(ClientConfig {
        api_key: "rotated-key".into(),
        secret_key: "rotated-secret".into(),
        ..cc
    })
    .unwrap();
    assert!(admin.get_cluster(&cluster).await.unwrap().is_some());

    // On the test's paused clock the rotation took no time: the snapshot is well within the
    // 1.5 s bound, so Refresh is always checked here.
    assert!(
        fetched.elapsed() < Duration::from_millis(1000),
        "{:?}",
        fetched.elapsed()
    );
    client
        .refresh(pb::RefreshRequest {})
        .await
        .expect("a recent snapshot is still served");
    assert_eq!(target_of(&mut client, &cluster).await.unwrap(), 3);
    let e = increase(&mut client, &cluster, 1, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
    assert!(
        e.message().contains("rejected the API key"),
        "{}",
        e.message()
    );
    assert!(!e.message().contains(SECRET_KEY), "{}", e.message());
    let c = admin.get_cluster(&cluster).await.unwrap().unwrap();
    assert_eq!((c.size, c.state.as_str()), (3, "Running"), "nothing ran");
    assert_eq!(target_of(&mut client, &cluster).await.unwrap(), 3);

    // Past the staleness bound the provider stops pretending (a span: the snapshot has to
    // grow older than the bound), and says why: the key, not an outage.
    elapse(Duration::from_millis(1600).saturating_sub(fetched.elapsed())).await;
    let e = client.refresh(pb::RefreshRequest {}).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
    assert!(
        e.message()
            .contains("CloudStack refused this provider's API key"),
        "{}",
        e.message()
    );
    wait_until("health NOT_SERVING on a stale snapshot", async || {
        health(addr).await == 2
    })
    .await;
    let _ = stop_tx.send(());
    let _ = server.await;
}

/// The real binary against an in-process simulator.
async fn provider_process(
    sim: &SimHandle,
    cluster: &str,
    flags: &[(&str, &str)],
) -> ProviderProcess {
    let mut args = ProviderArgs::new(
        &sim.api_url,
        &sim.api_key,
        &sim.secret_key,
        vec![format!("1:10:{cluster}")],
    );
    for (k, v) in flags {
        args = args.flag(k, v);
    }
    let p = ProviderProcess::spawn(bin(), &work_dir(), args).await;
    p.wait_serving(WAIT).await;
    p
}

/// Shows a provider process's log when the test fails while this lives.
pub(crate) struct LogOnFailure(PathBuf);

impl LogOnFailure {
    pub(crate) fn of(p: &ProviderProcess) -> Self {
        LogOnFailure(p.log_path.clone())
    }
}

impl Drop for LogOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.0).unwrap_or_default();
            eprintln!("provider log ({}):\n{log}", self.0.display());
        }
    }
}

pub(crate) fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_cks-autoscaler-provider"))
}

fn work_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("faults")
}

const FAST_FLAGS: [(&str, &str); 5] = [
    ("--job-poll-interval", "50ms"),
    ("--job-max-follow", "10m"),
    ("--refresh-min-interval", "0s"),
    ("--scale-watch", "200ms"),
    ("--staleness-bound", "60s"),
];

#[tokio::test]
async fn a_provider_killed_during_a_scale_up_is_replaced_by_one_that_adopts_the_job() {
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    cfg.settings.job_duration = Duration::from_millis(2500);
    let sim = Arc::new(sim::spawn(cfg).await.unwrap());
    let cluster = sim.cluster_id("demo").unwrap();
    let jobs = JobSampler::start(&sim, &cluster);
    let mut p = provider_process(&sim, &cluster, &FAST_FLAGS).await;
    let mut c = p.client();
    increase(&mut c, &cluster, 2, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(target_of(&mut c, &cluster).await.unwrap(), 5);

    p.restart(bin(), &work_dir()).await;
    let _log = LogOnFailure::of(&p);
    p.wait_serving(WAIT).await;
    assert_eq!(
        sim.cluster_json(&cluster)["state"],
        "Scaling",
        "job still running"
    );
    c.refresh(pb::RefreshRequest {}).await.unwrap();
    // Followed through the cluster's state: a job list could not prove any job its own.
    assert!(
        !sim.requests().iter().any(|r| r.command == "listAsyncJobs"),
        "the new process guessed at the account's jobs"
    );
    // The requested VMs exist in CloudStack (Starting), so the target is what was asked.
    assert_eq!(target_of(&mut c, &cluster).await.unwrap(), 5);
    // A removal and a scale-up queue behind the adopted job; the target shows both at once.
    let vm = sim.vms(&cluster)[1].clone();
    let mut d = tonic::Request::new(pb::NodeGroupDeleteNodesRequest {
        nodes: vec![node(&format!("external-cloudstack://{}", vm.0), &vm.1)],
        id: cluster.clone(),
    });
    d.set_timeout(Duration::from_secs(5));
    c.node_group_delete_nodes(d).await.unwrap();
    assert_eq!(target_of(&mut c, &cluster).await.unwrap(), 4);
    increase(&mut c, &cluster, 1, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(target_of(&mut c, &cluster).await.unwrap(), 5);
    assert_eq!(
        scale_requests(&sim).len(),
        1,
        "nothing sent while the job runs"
    );

    // When the job ends: the removal first, then the scale-up (sized on top of the VMs left),
    // one job at a time.
    wait_until(
        "CloudStack idle at size 5 without the removed VM",
        async || {
            let s = sim.cluster_json(&cluster);
            s["size"] == 5
                && s["state"] == "Running"
                && sim.running_jobs(&cluster) == 0
                && !sim.vms(&cluster).iter().any(|v| v.0 == vm.0)
        },
    )
    .await;
    c.refresh(pb::RefreshRequest {}).await.unwrap();
    assert_eq!(target_of(&mut c, &cluster).await.unwrap(), 5);
    let sent: Vec<_> = scale_requests(&sim)
        .iter()
        .map(|r| {
            r.params
                .get("size")
                .cloned()
                .unwrap_or_else(|| format!("nodeids={}", r.params["nodeids"]))
        })
        .collect();
    assert_eq!(
        sent,
        vec!["5".to_string(), format!("nodeids={}", vm.0), "5".into()]
    );
    assert_eq!(jobs.max(), 1);
}

#[tokio::test]
async fn a_provider_killed_during_a_removal_is_replaced_by_one_that_waits_for_it() {
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    cfg.settings.job_duration = Duration::from_millis(2500);
    let sim = Arc::new(sim::spawn(cfg).await.unwrap());
    let cluster = sim.cluster_id("demo").unwrap();
    let jobs = JobSampler::start(&sim, &cluster);
    let mut p = provider_process(&sim, &cluster, &FAST_FLAGS).await;
    let mut c = p.client();
    let (vid, vname, _) = sim.vms(&cluster)[3].clone();
    let mut d = tonic::Request::new(pb::NodeGroupDeleteNodesRequest {
        nodes: vec![node(&format!("external-cloudstack://{vid}"), &vname)],
        id: cluster.clone(),
    });
    d.set_timeout(Duration::from_secs(5));
    c.node_group_delete_nodes(d).await.unwrap();
    assert_eq!(target_of(&mut c, &cluster).await.unwrap(), 2);

    p.restart(bin(), &work_dir()).await;
    let _log = LogOnFailure::of(&p);
    p.wait_serving(WAIT).await;
    c.refresh(pb::RefreshRequest {}).await.unwrap();
    // The new process cannot know which nodes the running job removes; it never reports
    // fewer nodes than CloudStack's size (2 or 3 here: it is updated when the job ends).
    let t = target_of(&mut c, &cluster).await.unwrap();
    assert!((2..=3).contains(&t), "target {t}");
    // Nothing more is sent for the cluster until the job ends: a scale-up queues behind it
    // (or is refused while the job is not adopted yet).
    let queued = match increase(&mut c, &cluster, 1, Duration::from_secs(5)).await {
        Ok(()) => 1,
        Err(e) => {
            assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
            0
        }
    };
    assert_eq!(
        scale_requests(&sim).len(),
        1,
        "nothing sent while the job runs"
    );
    let want = 2 + queued;
    wait_until(
        &format!("CloudStack and the target settled at {want}"),
        async || {
            c.refresh(pb::RefreshRequest {}).await.unwrap();
            let s = sim.cluster_json(&cluster);
            let idle = sim.running_jobs(&cluster) == 0 && s["state"] == "Running";
            idle && s["size"] == want && target_of(&mut c, &cluster).await.unwrap() == want as i32
        },
    )
    .await;
    assert_eq!(scale_requests(&sim).len(), 1 + queued as usize);
    assert!(
        !sim.vms(&cluster).iter().any(|v| v.0 == vid),
        "the removed VM is gone"
    );
    assert_eq!(jobs.max(), 1);
}

#[tokio::test]
async fn a_frozen_provider_catches_up_after_a_time_gap() {
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    cfg.settings.job_duration = Duration::from_millis(600);
    let sim = Arc::new(sim::spawn(cfg).await.unwrap());
    let cluster = sim.cluster_id("demo").unwrap();
    let jobs = JobSampler::start(&sim, &cluster);
    let flags = [
        ("--job-poll-interval", "50ms"),
        ("--refresh-min-interval", "0s"),
        ("--scale-watch", "100ms"),
        ("--staleness-bound", "1s"),
    ];
    let p = provider_process(&sim, &cluster, &flags).await;
    let _log = LogOnFailure::of(&p);
    let mut c = p.client();
    increase(&mut c, &cluster, 1, Duration::from_secs(5))
        .await
        .unwrap();

    // Frozen for longer than the job and the staleness bound: when it runs again, its
    // follower's sleep and its snapshot's age have jumped by 2.5 s at once.
    p.freeze();
    let frozen = Instant::now();
    let sim2 = sim.clone();
    let cl = cluster.clone();
    wait_until("the job to end while the provider is frozen", async || {
        sim2.running_jobs(&cl) == 0 && sim2.cluster_json(&cl)["state"] == "Running"
    })
    .await;
    // The one real span of these tests: the gap is what is tested, and it has to pass on the
    // provider process's own clock (paused time cannot reach another process). 2.5 s frozen
    // is past the 600 ms job and the 1 s staleness bound.
    tokio::time::sleep_until(frozen + Duration::from_millis(2500)).await;
    p.thaw();

    // The first answers after the gap are right: the job's outcome, not a stale snapshot.
    assert_eq!(target_of(&mut c, &cluster).await.unwrap(), 4);
    c.refresh(pb::RefreshRequest {})
        .await
        .expect("Refresh fetches a fresh snapshot after the gap");
    wait_until("four running instances after the gap", async || {
        let n = c
            .node_group_nodes(pb::NodeGroupNodesRequest {
                id: cluster.clone(),
            })
            .await
            .unwrap()
            .into_inner()
            .instances;
        if n.len() == 4
            && n.iter()
                .all(|i| state_of(i) == InstanceState::InstanceRunning)
        {
            return true;
        }
        c.refresh(pb::RefreshRequest {}).await.unwrap();
        false
    })
    .await;
    p.wait_serving(WAIT).await;
    // Nothing was re-sent, and the provider scales again.
    assert_eq!(scale_requests(&sim).len(), 1);
    increase(&mut c, &cluster, 1, Duration::from_secs(5))
        .await
        .unwrap();
    wait_until("the second scale-up to run", async || {
        sim.cluster_json(&cluster)["size"] == 5
    })
    .await;
    assert_eq!(scale_requests(&sim).len(), 2);
    assert_eq!(jobs.max(), 1);
}

/// The autoscaler may hang up in the middle of an IncreaseSize (it was killed or restarted,
/// or its own context ran out): the call's future is dropped with the request to CloudStack on
/// its way. What was started must still be finished: the answer read, or the loss settled by
/// reading CloudStack. Left half way, the group would wait for ever for a request nobody
/// answers, and every later scale-up would only be queued behind it.
#[tokio::test(start_paused = true)]
async fn a_scale_up_whose_caller_hangs_up_is_still_carried_through() {
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    cfg.settings.job_duration = Duration::from_millis(800);
    let mut s = Stack::start(cfg, |_| {}).await;
    // Each call takes 0.6 s: the cluster is read, then scaleKubernetesCluster is on its way
    // when the caller gives up, 1 s into a 10 s deadline (the stream is reset).
    s.sim.configure(|c| c.latency = Duration::from_millis(600));
    let hung_up = tokio::time::timeout(
        Duration::from_secs(1),
        s.increase(1, Duration::from_secs(10)),
    )
    .await;
    assert!(hung_up.is_err(), "the caller hung up first: {hung_up:?}");
    s.sim.configure(|c| c.latency = Duration::ZERO);
    // CloudStack runs the request it received; the provider follows it, and the group takes
    // the next scale-up.
    s.settle_at(4).await;
    s.increase(1, Duration::from_secs(5))
        .await
        .expect("the next scale-up");
    s.settle_at(5).await;
    assert_eq!(s.requested_sizes(), ["4", "5"], "each scale-up sent once");
    assert_eq!(s.jobs.max(), 1);
}
