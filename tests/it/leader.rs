//! Leader election on a real kube-apiserver and etcd: one leader at a time, a standby that
//! takes over only once the leader stopped renewing for the lease duration, a leader that
//! stops acting (fences itself) a renew deadline after the API server went away, and a
//! released Lease taken at the next round. And two provider processes as deploy/ runs them.

use crate::faults::{LogOnFailure, bin, increase, scale_requests, target_of};
use cks_autoscaler_provider::app::ROLE_LABEL;
use cks_autoscaler_provider::kube::{KubeConfig, SERVICE_ACCOUNT_DIR_ENV, Token};
use cks_autoscaler_provider::leader::{self, Leadership, LeaseRef, Role};
use cks_domain::lease::LeaseTimings;
use cks_proto as pb;
use cks_proto::cloud_provider_client::CloudProviderClient;
use cks_sim::{self as sim, SimConfig};
use cks_testkit::kube::KubeApiServer;
use cks_testkit::process::{ProviderArgs, ProviderProcess};
use cks_testkit::*;
use serde_json::json;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// Short timings of the same shape as the defaults (15 s / 10 s / 2 s).
fn timings() -> LeaseTimings {
    LeaseTimings {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(200),
    }
}

fn lease(kube: &KubeApiServer) -> LeaseRef {
    lease_in(kube, "default")
}

fn lease_in(kube: &KubeApiServer, ns: &str) -> LeaseRef {
    LeaseRef {
        namespace: ns.into(),
        name: "cks-autoscaler-provider".into(),
        api: KubeConfig {
            url: kube.url(),
            ca_pem: kube.ca_pem().as_bytes().to_vec(),
            token: Token::Fixed(kube.admin_token().to_string()),
        },
    }
}

struct Replica {
    leadership: Leadership,
    stop: watch::Sender<bool>,
    task: JoinHandle<Role>,
}

fn replica(kube: &KubeApiServer, identity: &str) -> Replica {
    replica_of(lease(kube), identity)
}

fn replica_of(lease: LeaseRef, identity: &str) -> Replica {
    let leadership = Leadership::new(identity, timings());
    let (stop, rx) = watch::channel(false);
    let l = leadership.clone();
    let task = tokio::spawn(async move {
        leader::run(lease, l, rx)
            .await
            .unwrap_or_else(|e| panic!("leader election: {e}"))
    });
    Replica {
        leadership,
        stop,
        task,
    }
}

/// The Lease as the API server holds it: (holder, renewTime, leaseTransitions).
async fn read_lease(kube: &KubeApiServer) -> (String, String, u64) {
    let (code, v) = kube
        .request(
            reqwest::Method::GET,
            "/apis/coordination.k8s.io/v1/namespaces/default/leases/cks-autoscaler-provider",
            None,
        )
        .await
        .expect("GET the lease");
    if code != 200 {
        return (String::new(), String::new(), 0);
    }
    let spec = &v["spec"];
    (
        spec["holderIdentity"].as_str().unwrap_or_default().into(),
        spec["renewTime"].as_str().unwrap_or_default().into(),
        spec["leaseTransitions"].as_u64().unwrap_or(0),
    )
}

/// Waits for `cond`, checking at every poll that the replicas never both lead.
async fn wait_one_leader_at_most(
    what: &str,
    a: &Leadership,
    b: &Leadership,
    mut cond: impl AsyncFnMut() -> bool,
) {
    wait_until_for(what, Duration::from_secs(60), async || {
        assert!(
            !(a.leading() && b.leading()),
            "two leaders at once while waiting for {what}"
        );
        cond().await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_only_after_the_leader_stopped_renewing_and_never_beside_it() {
    let kube = KubeApiServer::start()
        .await
        .unwrap_or_else(|e| panic!("the Kubernetes API server did not start: {e}"));
    let a = replica(&kube, "provider-a");
    wait_until_for("a to lead", Duration::from_secs(60), async || {
        a.leadership.leading()
    })
    .await;
    assert_eq!(*a.leadership.watch().borrow(), Role::Leader);
    let b = replica(&kube, "provider-b");
    // B watches A renew for longer than the lease duration: it stays the standby.
    let mut renewals = std::collections::BTreeSet::new();
    wait_one_leader_at_most(
        "a to renew the lease for longer than its duration",
        &a.leadership,
        &b.leadership,
        async || {
            let (holder, renewed, _) = read_lease(&kube).await;
            assert_eq!(holder, "provider-a");
            renewals.insert(renewed);
            renewals.len() as u32
                > timings().lease_duration.as_millis() as u32
                    / timings().retry_period.as_millis() as u32
        },
    )
    .await;
    assert!(!b.leadership.leading());
    assert_eq!(b.leadership.holder().as_deref(), Some("provider-a"));

    // A dies without a word (its loop gone, nothing released): B leads once A's record has
    // not changed for the lease duration, and A had stopped leading by then.
    a.task.abort();
    let (_, _, transitions) = read_lease(&kube).await;
    let died = std::time::Instant::now();
    wait_one_leader_at_most("b to lead", &a.leadership, &b.leadership, async || {
        b.leadership.leading()
    })
    .await;
    assert!(
        died.elapsed() >= timings().lease_duration / 2,
        "taken over {:?} after the last renewal could have been sent",
        died.elapsed()
    );
    assert!(!a.leadership.leading());
    let (holder, _, after) = read_lease(&kube).await;
    assert_eq!(holder, "provider-b");
    assert_eq!(after, transitions + 1);

    // B stops on purpose and releases: C takes the Lease at its next rounds, long before a
    // lease duration.
    let c = replica(&kube, "provider-c");
    wait_until_for(
        "c to see b holding it",
        Duration::from_secs(60),
        async || c.leadership.holder().as_deref() == Some("provider-b"),
    )
    .await;
    let _ = b.stop.send(true);
    assert_eq!(b.task.await.expect("b's loop"), Role::Standby);
    assert!(!b.leadership.leading());
    let released = std::time::Instant::now();
    wait_one_leader_at_most("c to lead", &b.leadership, &c.leadership, async || {
        c.leadership.leading()
    })
    .await;
    assert!(
        released.elapsed() < timings().lease_duration,
        "a released lease waited {:?}",
        released.elapsed()
    );
    let _ = c.stop.send(true);
    let _ = c.task.await;
}

/// The API server goes away: the leader stops leading a renew deadline after its last
/// renewal, before the lease could expire for anyone, and its loop ends `Lost`; the standby
/// takes over once the API server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_server_stops_acting_before_its_lease_expires() {
    let mut kube = KubeApiServer::start()
        .await
        .unwrap_or_else(|e| panic!("the Kubernetes API server did not start: {e}"));
    let a = replica(&kube, "provider-a");
    wait_until_for("a to lead", Duration::from_secs(60), async || {
        a.leadership.leading()
    })
    .await;
    let b = replica(&kube, "provider-b");
    wait_until_for("b to see a", Duration::from_secs(60), async || {
        b.leadership.holder().as_deref() == Some("provider-a")
    })
    .await;
    kube.stop_apiserver();
    let cut = std::time::Instant::now();
    let mut role = a.leadership.watch();
    wait_until_for("a to lose the lease", Duration::from_secs(60), async || {
        *role.borrow_and_update() == Role::Lost
    })
    .await;
    assert!(!a.leadership.leading());
    assert!(
        cut.elapsed() < timings().lease_duration + timings().renew_deadline,
        "fenced {:?} after the cut",
        cut.elapsed()
    );
    assert_eq!(a.task.await.expect("a's loop"), Role::Lost);
    assert!(!b.leadership.leading());
    kube.restart_apiserver()
        .await
        .unwrap_or_else(|e| panic!("the API server did not come back: {e}"));
    wait_until_for("b to lead", Duration::from_secs(60), async || {
        b.leadership.leading()
    })
    .await;
    let (holder, _, _) = read_lease(&kube).await;
    assert_eq!(holder, "provider-b");
    let _ = b.stop.send(true);
    let _ = b.task.await;
}

/// Every Role of the kustomize base's provider RBAC, as one Role (the state's and leader
/// election's): the permissions the deployed provider has in its namespace.
fn deployed_roles() -> serde_json::Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/kustomize/base/provider-rbac.yaml"
    );
    let text = std::fs::read_to_string(path).expect("the base's provider-rbac.yaml");
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).expect("YAML");
    let rules: Vec<serde_json::Value> = docs
        .iter()
        .filter(|d| d["kind"] == "Role")
        .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
        .collect();
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "cks-autoscaler-provider"},
        "rules": rules,
    })
}

/// The provider's identity as deploy/ gives it, for provider processes outside a pod: a
/// ServiceAccount bound to the deployed Roles, its token, CA and namespace in a directory
/// ([`SERVICE_ACCOUNT_DIR_ENV`]), and a Pod object for each replica's name (the role label
/// goes there).
struct Deployed {
    ns: String,
    dir: std::path::PathBuf,
    sa: std::path::PathBuf,
    port: String,
}

impl Deployed {
    async fn new(kube: &KubeApiServer, ns: &str, pods: &[&str]) -> Deployed {
        let token = kube
            .service_account_token(ns, "cks-autoscaler-provider", &deployed_roles())
            .await
            .expect("the provider's identity");
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("leader-{ns}-{}", std::process::id()));
        let sa = dir.join("serviceaccount");
        std::fs::create_dir_all(&sa).expect("the service account dir");
        std::fs::write(sa.join("token"), &token).expect("token");
        std::fs::write(sa.join("ca.crt"), kube.ca_pem()).expect("ca.crt");
        std::fs::write(sa.join("namespace"), ns).expect("namespace");
        for pod in pods {
            kube.create(
                &format!("/api/v1/namespaces/{ns}/pods"),
                &json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pod, "namespace": ns},
                    "spec": {"serviceAccountName": "cks-autoscaler-provider",
                        "automountServiceAccountToken": false,
                        "containers": [{"name": "provider", "image": "cks-autoscaler-provider"}]}}),
            )
            .await
            .expect("the pod");
        }
        let port = kube
            .url()
            .rsplit(':')
            .next()
            .expect("the API server's port")
            .to_string();
        Deployed {
            ns: ns.to_string(),
            dir,
            sa,
            port,
        }
    }

    /// `serve --leader-elect --state-configmap` as `pod`, with [`timings`]' durations.
    async fn replica(
        &self,
        sim: &sim::SimHandle,
        cluster: &str,
        pod: &str,
        metrics: bool,
    ) -> ProviderProcess {
        let mut args = ProviderArgs::new(
            &sim.api_url,
            &sim.api_key,
            &sim.secret_key,
            vec![format!("1:10:{cluster}")],
        );
        args.metrics = metrics;
        for (k, v) in [
            ("--job-poll-interval", "50ms"),
            ("--refresh-min-interval", "0s"),
            ("--scale-watch", "200ms"),
            ("--state-configmap", STATE_CONFIGMAP),
            ("--leader-elect-lease-duration", "3s"),
            ("--leader-elect-renew-deadline", "2s"),
            ("--leader-elect-retry-period", "200ms"),
        ] {
            args = args.flag(k, v);
        }
        args.flags.push("--leader-elect".into());
        for (k, v) in [
            ("POD_NAME", pod),
            ("POD_NAMESPACE", self.ns.as_str()),
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", &self.port),
            (
                SERVICE_ACCOUNT_DIR_ENV,
                self.sa.to_str().expect("a UTF-8 path"),
            ),
        ] {
            args.env.push((k.to_string(), v.to_string()));
        }
        ProviderProcess::spawn(bin(), &self.dir.join(pod), args).await
    }
}

const STATE_CONFIGMAP: &str = "cks-autoscaler-provider-state";

/// A pod's `cks-autoscaler-provider/role` label.
async fn role_label(kube: &KubeApiServer, ns: &str, pod: &str) -> String {
    let (_, v) = kube
        .request(
            reqwest::Method::GET,
            &format!("/api/v1/namespaces/{ns}/pods/{pod}"),
            None,
        )
        .await
        .expect("GET the pod");
    v["metadata"]["labels"][ROLE_LABEL]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

async fn refresh(c: &mut CloudProviderClient<Channel>) -> Result<(), tonic::Status> {
    c.refresh(with_deadline(pb::RefreshRequest {}, Duration::from_secs(5)))
        .await
        .map(|_| ())
}

/// Two provider processes as deploy/ runs them (--state-configmap, --leader-elect, the pod's
/// name and namespace, the deployed Roles), on a real API server: one leads and is labelled
/// for the Service, the other answers UNAVAILABLE naming the leader. The leader accepts a
/// scale-up and a removal queued behind it, and is killed (SIGKILL) while the job runs: the
/// standby leads within the lease duration and a few rounds, takes over the recorded removal,
/// adopts the running job, and carries the removal out; CloudStack received each request once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leaders_promises_are_kept_by_the_standby_and_nothing_is_sent_twice() {
    let kube = KubeApiServer::start()
        .await
        .unwrap_or_else(|e| panic!("the Kubernetes API server did not start: {e}"));
    let ns = "cks-two";
    let deployed = Deployed::new(&kube, ns, &["provider-a", "provider-b"]).await;
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    cfg.settings.job_duration = Duration::from_millis(2500);
    let sim = sim::spawn(cfg).await.expect("the simulator");
    let cluster = sim.cluster_id("demo").expect("the demo cluster");
    let replica = async |pod: &str| deployed.replica(&sim, &cluster, pod, false).await;

    let mut a = replica("provider-a").await;
    let _log_a = LogOnFailure::of(&a);
    let mut ca = a.client();
    wait_until_for("a to lead and serve", Duration::from_secs(60), async || {
        refresh(&mut ca).await.is_ok()
    })
    .await;
    let b = replica("provider-b").await;
    let _log_b = LogOnFailure::of(&b);
    let mut cb = b.client();
    wait_until_for(
        "b to answer as the standby, naming the leader",
        Duration::from_secs(60),
        async || {
            refresh(&mut cb).await.is_err_and(|e| {
                e.code() == tonic::Code::Unavailable && e.message().contains("provider-a")
            })
        },
    )
    .await;
    wait_until_for("the pods labelled", Duration::from_secs(60), async || {
        role_label(&kube, ns, "provider-a").await == "leader"
            && role_label(&kube, ns, "provider-b").await == "standby"
    })
    .await;

    // The standby promises nothing: a scale-up asked of it is UNAVAILABLE and sends nothing.
    let refused = increase(&mut cb, &cluster, 1, Duration::from_secs(5))
        .await
        .expect_err("the standby refuses");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(scale_requests(&sim).is_empty());

    // A scale-up, and a removal queued behind its job: both promised by the leader.
    increase(&mut ca, &cluster, 1, Duration::from_secs(5))
        .await
        .expect("the scale-up");
    let vm = sim.vms(&cluster)[1].clone();
    let mut d = tonic::Request::new(pb::NodeGroupDeleteNodesRequest {
        nodes: vec![node(&format!("external-cloudstack://{}", vm.0), &vm.1)],
        id: cluster.clone(),
    });
    d.set_timeout(Duration::from_secs(5));
    ca.node_group_delete_nodes(d).await.expect("the removal");
    assert_eq!(target_of(&mut ca, &cluster).await.expect("target"), 3);
    assert_eq!(sim.running_jobs(&cluster), 1, "the scale-up's job runs");

    a.kill();
    let killed = std::time::Instant::now();
    wait_until_for("b to lead and serve", Duration::from_secs(60), async || {
        refresh(&mut cb).await.is_ok()
    })
    .await;
    assert!(
        killed.elapsed() < Duration::from_secs(15),
        "the standby served {:?} after the leader died",
        killed.elapsed()
    );
    assert_eq!(target_of(&mut cb, &cluster).await.expect("target"), 3);
    wait_until_for(
        "the removal carried out by the new leader",
        Duration::from_secs(60),
        async || {
            let s = sim.cluster_json(&cluster);
            s["size"] == 3
                && s["state"] == "Running"
                && sim.running_jobs(&cluster) == 0
                && !sim.vms(&cluster).iter().any(|v| v.0 == vm.0)
        },
    )
    .await;
    let sent: Vec<_> = scale_requests(&sim).into_iter().map(|r| r.params).collect();
    assert_eq!(sent.len(), 2, "one scale-up and one removal: {sent:?}");
    assert_eq!(
        sent[1].get("nodeids").map(String::as_str),
        Some(vm.0.as_str()),
        "{sent:?}"
    );
    wait_until_for("b labelled leader", Duration::from_secs(60), async || {
        role_label(&kube, ns, "provider-b").await == "leader"
    })
    .await;
}

/// A standby keeps the ledger loaded: it reads it every lease duration as a take-over would.
/// While the ConfigMap holds what no take-over could read, the standby is not Ready, its gauge
/// says 0 and its log says why, and the leader is left alone; once the ledger reads again it
/// is Ready, and when the Lease is released it takes over and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_that_could_not_read_the_ledger_is_not_ready_and_says_why() {
    let kube = KubeApiServer::start()
        .await
        .unwrap_or_else(|e| panic!("the Kubernetes API server did not start: {e}"));
    let ns = "cks-unreadable";
    let deployed = Deployed::new(&kube, ns, &["provider-a"]).await;
    let configmaps = format!("/api/v1/namespaces/{ns}/configmaps");
    let state = |text: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": STATE_CONFIGMAP, "namespace": ns},
            "data": {"state.json": text}})
    };
    kube.create(
        &configmaps,
        &state("{\"version\": 1, \"groups\": {\"x\": {\"removals\": 3}}}"),
    )
    .await
    .expect("the ledger no take-over could read");
    // Another replica leads meanwhile (the in-process elector, on the same Lease).
    let other = replica_of(lease_in(&kube, ns), "provider-z");
    wait_until_for("provider-z to lead", Duration::from_secs(60), async || {
        other.leadership.leading()
    })
    .await;

    let sim = sim::spawn(SimConfig::for_tests(API_KEY, SECRET_KEY))
        .await
        .expect("the simulator");
    let cluster = sim.cluster_id("demo").expect("the demo cluster");
    let a = deployed.replica(&sim, &cluster, "provider-a", true).await;
    let _log = LogOnFailure::of(&a);
    let metrics_addr = a.metrics_addr.expect("metrics");
    let ready = async || {
        reqwest::get(format!("http://{metrics_addr}/readyz"))
            .await
            .is_ok_and(|r| r.status().is_success())
    };
    let gauge = async || {
        a.metrics()
            .await
            .lines()
            .find_map(|l| l.strip_prefix("cks_provider_standby_ledger_readable "))
            .map(str::to_string)
    };
    wait_until_for(
        "the standby to report the ledger unreadable",
        Duration::from_secs(60),
        async || gauge().await.as_deref() == Some("0"),
    )
    .await;
    assert!(
        !ready().await,
        "a standby that could not take over is not Ready"
    );
    assert!(
        a.log().contains("cannot read the recorded promises"),
        "{}",
        a.log()
    );
    assert!(other.leadership.leading(), "the leader is left alone");
    assert!(scale_requests(&sim).is_empty());

    // The operator moves the bad ledger away: the next look (a lease duration) finds it gone.
    let (code, _) = kube
        .request(
            reqwest::Method::DELETE,
            &format!("{configmaps}/{STATE_CONFIGMAP}"),
            None,
        )
        .await
        .expect("DELETE the ConfigMap");
    assert_eq!(code, 200);
    wait_until_for("the standby Ready", Duration::from_secs(60), async || {
        ready().await && gauge().await.as_deref() == Some("1")
    })
    .await;
    assert_eq!(role_label(&kube, ns, "provider-a").await, "standby");

    let _ = other.stop.send(true);
    let _ = other.task.await;
    let mut c = a.client();
    wait_until_for(
        "provider-a to lead and serve",
        Duration::from_secs(60),
        async || refresh(&mut c).await.is_ok(),
    )
    .await;
}
