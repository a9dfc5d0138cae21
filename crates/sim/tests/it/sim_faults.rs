//! Fault injection: latency, proxy 5xx, dropped connections, malformed JSON; set by
//! configuration (as the flags do) and by `simConfigure`.

use std::time::Duration;
use tokio::time::Instant;

use cks_testkit::cs::*;
use cks_testkit::{sim_config, sim_config_with, start_sim, wait_until};

#[tokio::test(start_paused = true)]
async fn latency_delays_cloudstack_commands_not_sim_commands() {
    let sim = start_sim(sim_config_with(|c| {
        c.settings.latency = Duration::from_millis(300)
    }))
    .await;
    let c = Client::new(&sim);
    let t = Instant::now();
    assert_eq!(c.get("listZones", &[]).await.status, 200);
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    let echo = c.sim("simConfigure", &[("latencyms", "0")]).await;
    assert_eq!(echo["latencyms"], 0);
    assert_eq!(sim.settings().latency, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn proxy_errors_answer_html_and_do_not_execute() {
    let sim = start_sim(sim_config_with(|c| c.settings.error_rate = 1.0)).await;
    let c = Client::new(&sim);
    let id = sim.cluster_ids()[0].clone();
    let a = c
        .get("scaleKubernetesCluster", &[("id", &id), ("size", "5")])
        .await;
    assert!([502, 503, 504].contains(&a.status), "{}", a.status);
    assert!(
        a.text.starts_with("<html>") && a.text.contains("nginx"),
        "{}",
        a.text
    );
    assert!(serde_json::from_str::<serde_json::Value>(&a.text).is_err());
    assert_eq!(sim.running_jobs(&id), 0, "not executed");
    assert_eq!(sim.cluster_json(&id)["size"], 3);
    let recorded = sim.requests();
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].fault.as_deref(), Some("error"));
    // Simulator-only commands are never faulted.
    assert_eq!(
        c.sim("simConfigure", &[("errorrate", "0")]).await["errorrate"],
        0.0
    );
    assert_eq!(c.get("listZones", &[]).await.status, 200);
}

#[tokio::test(start_paused = true)]
async fn dropped_connections_execute_but_never_answer() {
    let sim = start_sim(sim_config()).await;
    let c = Client::new(&sim);
    let id = sim.cluster_ids()[0].clone();
    let worker = vm_ids(&c.cluster(&id).await, "-node-")[0].clone();
    c.sim("simConfigure", &[("droprate", "1")]).await;
    let r = c.try_get("stopVirtualMachine", &[("id", &worker)]).await;
    assert!(r.is_err(), "expected a transport error, got a response");
    // The command ran: the client just cannot know it.
    wait_until("VM stopped despite the lost answer", async || {
        sim.vms(&id)
            .iter()
            .any(|(v, _, s)| v == &worker && *s == cks_sim::VmState::Stopped)
    })
    .await;
    c.sim("simConfigure", &[("droprate", "0")]).await;
    assert_eq!(c.get("listZones", &[]).await.status, 200);
}

#[tokio::test(start_paused = true)]
async fn malformed_answers_are_truncated_json() {
    let sim = start_sim(sim_config_with(|c| c.settings.malformed_rate = 1.0)).await;
    let c = Client::new(&sim);
    let a = c.get("listKubernetesClusters", &[]).await;
    assert_eq!(a.status, 200);
    assert!(
        a.text.starts_with("{\"listkubernetesclustersresponse\""),
        "{}",
        a.text
    );
    assert!(
        serde_json::from_str::<serde_json::Value>(&a.text).is_err(),
        "{}",
        a.text
    );
}

#[tokio::test(start_paused = true)]
async fn partial_rates_fault_some_requests_and_not_others() {
    let sim = start_sim(sim_config_with(|c| c.settings.error_rate = 0.5)).await;
    let c = Client::new(&sim);
    let mut ok = 0;
    let mut failed = 0;
    for _ in 0..60 {
        match c.get("listZones", &[]).await.status {
            200 => ok += 1,
            _ => failed += 1,
        }
    }
    assert!(ok > 5 && failed > 5, "ok {ok}, failed {failed}");
}

#[tokio::test(start_paused = true)]
async fn sim_configure_rejects_bad_values_and_echoes_the_config() {
    let sim = start_sim(sim_config()).await;
    let c = Client::new(&sim);
    let a = c
        .raw(&format!("{}?command=simConfigure&errorrate=2", sim.api_url))
        .await
        .unwrap();
    assert_eq!(a.status, 431);
    assert!(
        a.text
            .contains("errorrate must be a number between 0 and 1"),
        "{}",
        a.text
    );
    let a = c
        .raw(&format!("{}?command=simConfigure&colour=red", sim.api_url))
        .await
        .unwrap();
    assert_eq!(a.status, 431);
    assert!(
        a.text.contains("unknown simConfigure parameter"),
        "{}",
        a.text
    );
    let echo = c
        .sim(
            "simConfigure",
            &[
                ("jobdurationms", "123"),
                ("kubeletdelayms", "7"),
                ("scannerintervalms", "9"),
            ],
        )
        .await;
    for key in [
        "latencyms",
        "errorrate",
        "droprate",
        "malformedrate",
        "jobdurationms",
        "jobfailure",
        "alertscaling",
        "kubeletdelayms",
        "scannerintervalms",
    ] {
        assert!(echo.get(key).is_some(), "{key} missing from {echo}");
    }
    assert_eq!(
        (
            echo["jobdurationms"].as_u64(),
            echo["kubeletdelayms"].as_u64()
        ),
        (Some(123), Some(7))
    );
    assert_eq!(sim.settings().job_duration, Duration::from_millis(123));
}
