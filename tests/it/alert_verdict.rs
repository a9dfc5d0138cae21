//! The verdict "this CloudStack does not scale clusters in Alert" is learned from one refusal
//! and can change: it is shown (debug line, metrics), and it is dropped after
//! `alert_recheck`, so a CloudStack upgraded to one with the Alert-scaling change is used as
//! such without restarting the provider.

use cks_testkit::stack::*;
use cks_testkit::*;
use std::time::Duration;
use tonic::Code;

#[tokio::test(start_paused = true)]
async fn a_learned_alert_verdict_is_shown_and_asked_again_after_the_recheck_time() {
    let mut cfg = sim_config();
    cfg.settings.alert_scaling = false;
    let mut env = Stack::refreshed(cfg, "demo", |s| {
        s.alert_recheck = Duration::from_secs(60);
    })
    .await;
    assert_eq!(
        env.provider.health().alert_verdict().verdict.as_str(),
        "unknown"
    );
    let (wid, _, _) = env.workers()[0].clone();
    env.sim.stop_vm(&wid);
    env.sim.scan_now();
    env.wait_state("Alert").await;
    env.refresh().await.unwrap();

    // CloudStack refuses although every rule allows the scale-up: the verdict is learned.
    let e = env.increase(1).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    let v = env.provider.health().alert_verdict();
    assert_eq!(v.verdict.as_str(), "unsupported");
    assert!(
        v.reason
            .as_deref()
            .is_some_and(|r| r.contains("Alert state and can not be scaled")),
        "{v:?}"
    );
    let group = env.provider.all_groups().node_groups().remove(0);
    assert!(
        group
            .debug
            .contains("Alert scaling: unsupported by this CloudStack since"),
        "{}",
        group.debug
    );
    // Refused locally meanwhile.
    elapse(Duration::from_secs(30)).await;
    let e = env.increase(1).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert_eq!(env.scale_requests().len(), 1);
    let v = env.provider.health().alert_verdict();
    assert_eq!(v.age, Some(Duration::from_secs(30)));
    assert_eq!(v.recheck_in, Some(Duration::from_secs(30)));

    // CloudStack is upgraded meanwhile; past the recheck time the provider asks it again.
    env.sim.configure(|s| s.alert_scaling = true);
    elapse(Duration::from_secs(31)).await;
    assert_eq!(
        env.provider.health().alert_verdict().verdict.as_str(),
        "unknown"
    );
    env.refresh().await.unwrap();
    env.increase(1)
        .await
        .expect("scaled in Alert after the upgrade");
    assert_eq!(env.scale_requests().len(), 2);
    assert_eq!(
        env.provider.health().alert_verdict().verdict.as_str(),
        "unknown"
    );
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_upgrade_of_cloudstack_drops_the_learned_verdict_at_once() {
    let mut cfg = sim_config();
    cfg.settings.alert_scaling = false;
    let mut env = Stack::refreshed(cfg, "demo", |s| {
        s.alert_recheck = Duration::from_secs(3600);
    })
    .await;
    let (wid, _, _) = env.workers()[0].clone();
    env.sim.stop_vm(&wid);
    env.sim.scan_now();
    env.wait_state("Alert").await;
    env.refresh().await.unwrap();
    env.increase(1).await.unwrap_err();
    assert_eq!(
        env.provider.health().alert_verdict().verdict.as_str(),
        "unsupported"
    );
    // The same version a minute later: the verdict stands.
    elapse(Duration::from_secs(61)).await;
    env.refresh().await.unwrap();
    assert_eq!(
        env.provider.health().alert_verdict().verdict.as_str(),
        "unsupported"
    );
    // Upgraded to a CloudStack with the Alert-scaling change: the next check drops it.
    env.sim.set_cloudstack_version("4.23.0.0");
    env.sim.configure(|s| s.alert_scaling = true);
    elapse(Duration::from_secs(61)).await;
    env.refresh().await.unwrap();
    assert_eq!(
        env.provider.health().alert_verdict().verdict.as_str(),
        "unknown"
    );
    env.increase(1)
        .await
        .expect("scaled in Alert after the upgrade");
    env.shutdown().await;
}
