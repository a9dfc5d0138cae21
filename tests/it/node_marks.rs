//! `--confirm-node-marks` against a real Kubernetes API server (`cks_testkit::kube`, its
//! binaries set up on first use): an owed removal is tried again only
//! while its Node still carries the autoscaler's `ToBeDeletedByClusterAutoscaler` mark, and a
//! node suspected of a cordon a failed drain left holds scale-ups only while its Node is not
//! counted Ready.
//! Upstream marks a node before DeleteNodes (`core/scaledown/actuation/actuator.go`) and a
//! restarted autoscaler removes every mark without calling Cleanup
//! (`StaticAutoscaler.cleanUpIfRequired`): those nodes are schedulable again.
//!
//! The provider's identity is a ServiceAccount token bound to the ClusterRole the kustomize
//! base deploys (`deploy/kustomize/base/provider-rbac.yaml`). Real time: the API server is a
//! process whose answers take real time.

use cks_autoscaler_provider::kube::{KubeConfig, Token};
use cks_proto::instance_status::InstanceState;
use cks_sim::VmState;
use cks_testkit::kube::KubeApiServer;
use cks_testkit::stack::*;
use cks_testkit::*;
use serde_json::{Value, json};
use std::time::Duration;

/// The kustomize base's provider RBAC document of `kind`.
fn deployed(kind: &str) -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/kustomize/base/provider-rbac.yaml"
    );
    let text = std::fs::read_to_string(path).expect("the base's provider-rbac.yaml");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("YAML");
    docs.into_iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("a {kind} in provider-rbac.yaml"))
}

/// The Node of a worker VM, as its kubelet registers it, marked by the autoscaler or not.
fn node(name: &str, marked: bool) -> Value {
    let taints = if marked {
        json!([{"key": "ToBeDeletedByClusterAutoscaler", "value": "1764806400", "effect": "NoSchedule"}])
    } else {
        json!([])
    };
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "spec": {"taints": taints},
    })
}

/// Node `name` as `edit` changes it (GET, then PUT).
async fn edit_node(kube: &KubeApiServer, name: &str, edit: impl FnOnce(&mut Value)) {
    let path = format!("/api/v1/nodes/{name}");
    let (code, mut n) = kube
        .request(reqwest::Method::GET, &path, None)
        .await
        .expect("GET the node");
    assert_eq!(code, 200, "{n}");
    edit(&mut n);
    let (code, answer) = kube
        .request(reqwest::Method::PUT, &path, Some(&n))
        .await
        .expect("PUT the node");
    assert_eq!(code, 200, "{answer}");
}

/// Sets Node `name`'s taints and cordon (`spec.unschedulable`).
async fn set_node(kube: &KubeApiServer, name: &str, marked: bool, cordoned: bool) {
    edit_node(kube, name, |n| {
        n["spec"] = node(name, marked)["spec"].clone();
        n["spec"]["unschedulable"] = json!(cordoned);
    })
    .await;
}

/// A Node as its kubelet keeps it: Ready.
fn ready_node(name: &str, marked: bool) -> Value {
    let mut n = node(name, marked);
    n["status"] = json!({"conditions": [{"type": "Ready", "status": "True"}]});
    n
}

/// The provider's identity (the kustomize base's RBAC) on `kube`, as `--confirm-node-marks`
/// uses it.
async fn provider_api(kube: &KubeApiServer, ns: &str) -> KubeConfig {
    let account = "cks-autoscaler-provider";
    let token = kube
        .service_account_token(ns, account, &deployed("Role"))
        .await
        .expect("the provider's identity");
    kube.bind_cluster_role(ns, account, &deployed("ClusterRole"))
        .await
        .expect("the deployed ClusterRole");
    KubeConfig {
        url: kube.url(),
        ca_pem: kube.ca_pem().as_bytes().to_vec(),
        token: Token::Fixed(token),
    }
}

/// Removes the autoscaler's mark from Node `name` (what a restarted autoscaler does).
/// Whether the provider has seen its last job end, as its node group's debug line tells an
/// operator. Until then a scale-up is queued behind the job (answered OK), not refused.
fn follows_no_job(env: &Stack) -> bool {
    let debug = env.provider.all_groups().node_groups().remove(0).debug;
    ![
        "; removing ",
        "; scale-up ",
        "; job ",
        "; scale job ",
        "; a scale job ",
    ]
    .iter()
    .any(|phase| debug.contains(phase))
}

async fn unmark(kube: &KubeApiServer, name: &str) {
    edit_node(kube, name, |n| n["spec"]["taints"] = json!([])).await;
}

/// Two removals owed behind a scale-up; the autoscaler restarts and removes the mark of one
/// node. The next refresh withdraws that removal (its VM back in the target, no longer listed
/// Deleting, a WARN naming it); the other, still marked, is carried out when the scale-up ends,
/// and only it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owed_removal_whose_node_lost_the_autoscalers_mark_is_withdrawn() {
    let kube = KubeApiServer::start()
        .await
        .unwrap_or_else(|e| panic!("the Kubernetes API server did not start: {e}"));
    logs::capture();
    let api = provider_api(&kube, "node-marks").await;
    // Scale-ups long enough for the test to look while the removals wait behind one.
    let mut cfg = pool(4);
    cfg.settings.job_duration = Duration::from_secs(8);
    let mut env = Stack::refreshed(cfg, "pool", move |s| {
        s.groups[0].min = 1;
        s.node_marks = Some(api);
    })
    .await;
    let workers = env.workers();
    let (kept, removed) = (&workers[0], &workers[1]);
    for w in [kept, removed] {
        kube.create("/api/v1/nodes", &node(&w.1.to_lowercase(), true))
            .await
            .expect("the node");
    }
    env.increase(1).await.expect("scale-up accepted");
    for w in [kept, removed] {
        env.delete(vec![worker_node(w)])
            .await
            .expect("owed behind the scale-up");
    }
    assert_eq!(env.target().await, 3, "5 workers asked, 2 owed removals");

    // The autoscaler restarts: it removes its marks, this one first.
    unmark(&kube, &kept.1.to_lowercase()).await;
    env.refresh().await.expect("Refresh");
    assert_eq!(env.target().await, 4, "the withdrawn VM counts again");
    let state = |instances: &[cks_proto::Instance], vm: &str| {
        instances.iter().find(|i| i.id.contains(vm)).map(state_of)
    };
    let instances = env.instances().await;
    assert_eq!(
        state(&instances, &kept.0),
        Some(InstanceState::InstanceRunning)
    );
    assert_eq!(
        state(&instances, &removed.0),
        Some(InstanceState::InstanceDeleting)
    );
    let warned = logs::lines_mentioning(&kept.0);
    assert!(
        warned.iter().any(|l| l.contains("removal withdrawn")),
        "{warned:?}"
    );

    // The scale-up ends; the marked one goes, the withdrawn one stays.
    wait_until_for(
        "the marked node's VM removed",
        Duration::from_secs(120),
        async || {
            env.refresh().await.ok();
            !env.workers().iter().any(|w| w.0 == removed.0)
        },
    )
    .await;
    assert!(
        env.workers().iter().any(|w| w.0 == kept.0),
        "withdrawn, yet removed"
    );
    let nodeids: Vec<String> = env
        .scale_requests()
        .iter()
        .filter_map(|r| r.get("nodeids").cloned())
        .collect();
    assert!(
        nodeids.iter().all(|ids| !ids.contains(&kept.0)),
        "{nodeids:?}"
    );
    env.shutdown().await;
}

/// With the project key (no stopVirtualMachine), a removal's drain fails and leaves the node
/// cordoned; the autoscaler restarts and gives the node up (its mark removed), so nobody owes
/// its removal. A removal of another, stopped, worker then succeeds, and CloudStack lists the
/// cluster Running although the node is still cordoned: its status scanner never turns a
/// Running cluster to Alert for a node, only for a VM. A scale-up CloudStack would time out
/// on the cordoned node is refused, naming it. The operator uncordons the node: its Node, read
/// Ready and schedulable, lifts the suspicion, and the next scale-up is sent and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_read_ready_and_schedulable_no_longer_holds_scale_ups() {
    let kube = KubeApiServer::start()
        .await
        .unwrap_or_else(|e| panic!("the Kubernetes API server did not start: {e}"));
    logs::capture();
    let api = provider_api(&kube, "node-cordons").await;
    let mut cfg = pool(4);
    cfg.settings.fail_drains = 1;
    cfg.settings.key_role = cks_sim::KeyRole::ProjectKubernetes;
    let mut env = Stack::refreshed(cfg, "pool", move |s| {
        s.groups[0].min = 1;
        s.node_marks = Some(api);
    })
    .await;
    let workers = env.workers();
    let (victim, stopped) = (&workers[0], &workers[1]);
    for w in &workers {
        kube.create("/api/v1/nodes", &ready_node(&w.1.to_lowercase(), true))
            .await
            .expect("the node");
    }
    // The drain about to fail cordons the node first (`kubectl drain`), as the simulator's
    // does: the Node says so before the provider can read it after the job.
    set_node(&kube, &victim.1.to_lowercase(), true, true).await;
    env.delete(vec![worker_node(victim)])
        .await
        .expect("accepted");
    wait_until_for(
        "the removal's drain to fail",
        Duration::from_secs(60),
        async || env.sim.running_jobs(&env.cluster_id) == 0 && env.cluster_state() == "Alert",
    )
    .await;
    // The restarted autoscaler removed its mark; the drain's cordon stays.
    set_node(&kube, &victim.1.to_lowercase(), false, true).await;
    wait_until_for(
        "the removal withdrawn",
        Duration::from_secs(60),
        async || {
            env.refresh().await.ok();
            env.target().await == 4
        },
    )
    .await;

    // Another worker stopped, its removal asked for and carried out: Running.
    assert!(env.sim.stop_vm(&stopped.0));
    wait_until_for(
        "the stopped worker listed",
        Duration::from_secs(60),
        async || {
            env.refresh().await.ok();
            env.workers()
                .iter()
                .any(|w| w.0 == stopped.0 && w.2 != VmState::Running)
        },
    )
    .await;
    env.delete(vec![worker_node(stopped)])
        .await
        .expect("a down worker's removal");
    wait_until_for(
        "the down worker removed",
        Duration::from_secs(60),
        async || {
            env.refresh().await.ok();
            !env.workers().iter().any(|w| w.0 == stopped.0)
                && env.sim.running_jobs(&env.cluster_id) == 0
                && env.cluster_state() == "Running"
                && follows_no_job(&env)
        },
    )
    .await;

    let held = env.increase(1).await.expect_err("held by the cordon");
    assert_eq!(held.code(), tonic::Code::FailedPrecondition, "{held:?}");
    assert!(
        held.message().contains(&victim.1.to_lowercase()),
        "{held:?}"
    );

    // kubectl uncordon.
    assert!(env.sim.uncordon_node(&victim.0));
    set_node(&kube, &victim.1.to_lowercase(), false, false).await;
    env.refresh().await.expect("Refresh");
    let failed_before = env.sim.failed_jobs().len();
    env.increase(1).await.expect("sent");
    wait_until_for("the scale-up done", Duration::from_secs(120), async || {
        env.refresh().await.ok();
        env.sim.running_jobs(&env.cluster_id) == 0 && env.cluster_size() == 4
    })
    .await;
    assert_eq!(
        env.sim.failed_jobs().len(),
        failed_before,
        "{:?}",
        env.sim.failed_jobs()
    );
    assert_eq!(env.cluster_state(), "Running");
    env.shutdown().await;
}
