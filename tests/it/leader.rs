//! Leader election on a real kube-apiserver and etcd: one leader at a time, a standby that
//! takes over only once the leader stopped renewing for the lease duration, a leader that
//! stops acting (fences itself) a renew deadline after the API server went away, and a
//! released Lease taken at the next round.

use cks_autoscaler_provider::kube::{KubeConfig, Token};
use cks_autoscaler_provider::leader::{self, Leadership, LeaseRef, Role};
use cks_domain::lease::LeaseTimings;
use cks_testkit::kube::KubeApiServer;
use cks_testkit::*;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Short timings of the same shape as the defaults (15 s / 10 s / 2 s).
fn timings() -> LeaseTimings {
    LeaseTimings {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(200),
    }
}

fn lease(kube: &KubeApiServer) -> LeaseRef {
    LeaseRef {
        namespace: "default".into(),
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
    let leadership = Leadership::new(identity, timings());
    let (stop, rx) = watch::channel(false);
    let l = leadership.clone();
    let lease = lease(kube);
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
    let Some(kube) = KubeApiServer::start()
        .await
        .unwrap_or_else(|e| panic!("the Kubernetes API server did not start: {e}"))
    else {
        return;
    };
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
    let Some(mut kube) = KubeApiServer::start()
        .await
        .unwrap_or_else(|e| panic!("the Kubernetes API server did not start: {e}"))
    else {
        return;
    };
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
