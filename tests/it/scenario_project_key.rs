//! The key CKS puts in a project cluster's `cloudstack-secret` (CloudStack 4.19.3 / 4.20.1 on:
//! the Project Kubernetes Service Role, `KubernetesClusterManagerImpl.
//! PROJECT_KUBERNETES_ACCOUNT_ROLE_ALLOWED_APIS`) may call only `listKubernetesClusters`,
//! `scaleKubernetesCluster`, `queryAsyncJobResult` and `listVirtualMachines`; the simulator
//! answers anything else 432. With that key the provider does its whole job: the template node
//! (from a worker VM's sizes), a scale-up, a scale-down with a drain, the verdict kept; each
//! optional command is tried once, and what is lost is said once.
//!
//! Such a cluster belongs to a CloudStack project, whose resources CloudStack lists only for a
//! call naming the project (`projectid`; the simulator's `SimSettings::project`). Without
//! `project-id` in the cloud-config the provider does not find the cluster, and says so, naming
//! `project-id`; with it, the list calls carry `projectid`, the calls on one entity (scale, job
//! query) do not, and the provider does its whole job.

use cks_autoscaler_provider::optional_rpcs::ProviderExtras;
use cks_proto as pb;
use cks_sim::{KeyRole, Project, SimConfig};
use cks_testkit::stack::*;
use cks_testkit::*;
use prost::Message;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The four commands of the project role.
const ROLE: [&str; 4] = [
    "listKubernetesClusters",
    "scaleKubernetesCluster",
    "queryAsyncJobResult",
    "listVirtualMachines",
];

#[tokio::test(start_paused = true)]
async fn with_the_project_key_the_provider_scales_and_tries_each_optional_command_once() {
    logs::capture();
    let mut cfg = pool(3);
    cfg.settings.key_role = KeyRole::ProjectKubernetes;
    let mut env = Stack::start_with_extras(
        cfg,
        "pool",
        |s| s.groups[0].min = 1,
        std::sync::Arc::new(ProviderExtras::default()),
    )
    .await;
    env.refresh().await.expect("first Refresh");

    // The template node, built from a worker VM's CPUs and memory.
    let bytes = env
        .client
        .node_group_template_node_info(pb::NodeGroupTemplateNodeInfoRequest {
            id: env.cluster_id.clone(),
        })
        .await
        .expect("a template node without listServiceOfferings")
        .into_inner()
        .node_bytes;
    let node = k8s_pb::api::core::v1::Node::decode(bytes.as_slice()).expect("a Node");
    let capacity = node.status.expect("status").capacity;
    let quantity = |k: &str| capacity.get(k).and_then(|q| q.string.clone());
    assert_eq!(quantity("cpu").as_deref(), Some("2"), "{capacity:?}");
    assert!(quantity("memory").is_some(), "{capacity:?}");

    // A scale-up, and a scale-down of a Running worker (drained by CloudStack).
    env.increase(1).await.expect("scale-up");
    wait_until("four workers", async || {
        let _ = env.refresh().await;
        env.cluster_size() == 4 && env.cluster_state() == "Running"
    })
    .await;
    let victim = env.workers()[0].clone();
    env.delete(vec![worker_node(&victim)])
        .await
        .expect("scale-down accepted");
    wait_until("three workers", async || {
        let _ = env.refresh().await;
        env.cluster_size() == 3 && !env.workers().iter().any(|w| w.0 == victim.0)
    })
    .await;
    // Refreshes over an hour: the version check and the offering are not asked again.
    for _ in 0..6 {
        elapse(Duration::from_secs(600)).await;
        env.refresh().await.expect("refresh");
    }

    let mut asked: BTreeMap<String, usize> = BTreeMap::new();
    for r in env.sim.requests() {
        *asked.entry(r.command).or_default() += 1;
    }
    for (command, times) in &asked {
        if !ROLE.contains(&command.as_str()) {
            assert_eq!(
                *times, 1,
                "{command} is optional: tried once, then learned ({asked:?})"
            );
        }
    }
    for lost in ["listServiceOfferings", "listCapabilities"] {
        assert_eq!(asked.get(lost), Some(&1), "{asked:?}");
        let said: Vec<String> = logs::lines_mentioning(&format!("may not call {lost} (optional)"))
            .into_iter()
            .filter(|l| l.contains(&env.sim.api_url))
            .collect();
        assert_eq!(said.len(), 1, "what is lost is said once: {said:?}");
    }
    env.shutdown().await;
}

/// The project the clusters of these scenarios belong to.
const PROJECT: &str = "7c1e4b2a-93d5-4f08-b6a1-5e2d9c8f3b71";

/// A Running cluster "pool" of three workers in [`PROJECT`], with the project key's role. Its
/// own seed, so that its ids (and the log lines naming them) are this scenario's alone.
fn project_pool(seed: u64) -> SimConfig {
    let mut cfg = pool(3);
    cfg.seed = seed;
    cfg.settings.key_role = KeyRole::ProjectKubernetes;
    cfg.settings.project = Some(Project::new(PROJECT, "team-a").expect("a project"));
    cfg
}

/// The list commands the provider sends (CloudStack scopes them to a project by `projectid`).
const LISTS: [&str; 2] = ["listKubernetesClusters", "listVirtualMachines"];

#[tokio::test(start_paused = true)]
async fn without_project_id_a_project_cluster_is_not_found_and_the_error_names_project_id() {
    logs::capture();
    let mut env = Stack::start_with_client(
        project_pool(0x9e01),
        "pool",
        |s| s.groups[0].min = 1,
        Arc::new(ProviderExtras::default()),
        |_| {},
    )
    .await;
    let cluster = env.cluster_id.clone();

    // What the autoscaler gets: Refresh fails, UNAVAILABLE (its loop skips and tries again),
    // with the reason and the hint.
    let err = env
        .refresh()
        .await
        .expect_err("the cluster is not listed without projectid");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    let text = err.message();
    assert!(
        text.contains(&format!("cluster {cluster} is not listed by CloudStack")),
        "{text}"
    );
    assert!(
        text.contains("set project-id in the cloud-config"),
        "{text}"
    );

    // What an operator sees: the provider is not Ready, and the log says why.
    assert!(
        !*env.provider.health().ready().borrow(),
        "not Ready without a snapshot"
    );
    let said: Vec<String> = logs::lines_mentioning("refresh from CloudStack failed")
        .into_iter()
        .filter(|l| l.contains(&cluster))
        .collect();
    assert!(!said.is_empty(), "a warning for the failed refresh");
    assert!(
        said.iter().all(|l| l.contains("set project-id")),
        "{said:?}"
    );

    // The provider asked, without projectid, and scaled nothing.
    let asked = env.sim.requests();
    assert!(
        asked.iter().any(|r| r.command == "listKubernetesClusters"),
        "{asked:?}"
    );
    assert!(
        asked.iter().all(|r| !r.params.contains_key("projectid")),
        "{asked:?}"
    );
    assert!(env.scale_requests().is_empty());
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_project_id_naming_no_project_is_what_the_autoscaler_and_the_log_are_told() {
    logs::capture();
    // A copy-paste slip: another UUID than the project's.
    let wrong = "0d9e8f7a-6b5c-4d3e-8f2a-1b0c9d8e7f6a";
    let mut env = Stack::start_with_client(
        project_pool(0x9e03),
        "pool",
        |s| s.groups[0].min = 1,
        Arc::new(ProviderExtras::default()),
        |c| c.project_id = Some(wrong.into()),
    )
    .await;
    let err = env
        .refresh()
        .await
        .expect_err("CloudStack refuses the projectid");
    let text = err.message();
    assert!(
        text.contains(&format!(
            "CloudStack refuses project-id {wrong}: it names no project this key is a member of"
        )),
        "{text}"
    );
    assert!(!*env.provider.health().ready().borrow(), "not Ready");
    let said = logs::lines_mentioning("refresh from CloudStack failed");
    assert!(
        said.iter()
            .any(|l| l.contains(&format!("CloudStack refuses project-id {wrong}"))),
        "{said:?}"
    );
    assert!(env.scale_requests().is_empty());
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn with_project_id_the_provider_lists_in_the_project_and_scales_as_usual() {
    logs::capture();
    let mut env = Stack::start_with_client(
        project_pool(0x9e02),
        "pool",
        |s| s.groups[0].min = 1,
        Arc::new(ProviderExtras::default()),
        |c| c.project_id = Some(PROJECT.into()),
    )
    .await;
    env.refresh().await.expect("first Refresh, in the project");
    assert!(
        *env.provider.health().ready().borrow(),
        "Ready once the cluster is listed"
    );

    // The template node comes from a worker VM (listVirtualMachines, in the project).
    let bytes = env
        .client
        .node_group_template_node_info(pb::NodeGroupTemplateNodeInfoRequest {
            id: env.cluster_id.clone(),
        })
        .await
        .expect("a template node from the project's VMs")
        .into_inner()
        .node_bytes;
    let node = k8s_pb::api::core::v1::Node::decode(bytes.as_slice()).expect("a Node");
    assert!(node.status.is_some_and(|s| s.capacity.contains_key("cpu")));

    env.increase(1).await.expect("scale-up");
    wait_until("four workers", async || {
        let _ = env.refresh().await;
        env.cluster_size() == 4 && env.cluster_state() == "Running"
    })
    .await;
    assert_eq!(env.target().await, 4);
    let victim = env.workers()[0].clone();
    env.delete(vec![worker_node(&victim)])
        .await
        .expect("scale-down accepted");
    wait_until("three workers", async || {
        let _ = env.refresh().await;
        env.cluster_size() == 3 && !env.workers().iter().any(|w| w.0 == victim.0)
    })
    .await;
    env.wait_provider_settled().await;
    assert_eq!(env.target().await, 3);

    // Every list call named the project; the calls on one entity did not need to.
    let asked = env.sim.requests();
    for command in LISTS {
        let calls: Vec<_> = asked.iter().filter(|r| r.command == command).collect();
        assert!(!calls.is_empty(), "{command} was called: {asked:?}");
        for r in calls {
            assert_eq!(
                r.params.get("projectid").map(String::as_str),
                Some(PROJECT),
                "{r:?}"
            );
        }
    }
    let scales = env.scale_requests();
    assert_eq!(scales.len(), 2, "one scale-up, one scale-down: {scales:?}");
    for command in ["scaleKubernetesCluster", "queryAsyncJobResult"] {
        assert!(
            asked
                .iter()
                .filter(|r| r.command == command)
                .all(|r| !r.params.contains_key("projectid")),
            "{command} carries no projectid: {asked:?}"
        );
    }
    assert!(
        logs::lines_mentioning("refresh from CloudStack failed")
            .iter()
            .all(|l| !l.contains(&env.cluster_id)),
        "no failed refresh"
    );
    env.shutdown().await;
}

/// A key whose role allows only `list*` still submits scaleKubernetesCluster (a command its
/// rules do not name falls back to the command's role types) and CloudStack fails the job on
/// its check of the caller's right (recorded from a CloudStack 4.21.0.0:
/// `errors_13_perm_bob_listonly_scale`): the autoscaler hears PERMISSION_DENIED naming the
/// key's role, not a refusal of its request, and nothing changed.
#[tokio::test(start_paused = true)]
async fn a_scale_the_keys_role_may_not_make_is_named_as_the_keys() {
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    cfg.settings.key_role = KeyRole::ListOnly;
    let mut env = Stack::refreshed(cfg, "demo", |_| {}).await;
    let e = env.increase(1).await.expect_err("the job fails");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{}", e.message());
    for said in [
        "Caller does not have permission",
        "the key's role does not allow scaleKubernetesCluster",
    ] {
        assert!(e.message().contains(said), "{said}: {}", e.message());
    }
    assert_eq!(
        env.sim.cluster_json(&env.cluster_id)["size"],
        3,
        "nothing ran"
    );
    env.shutdown().await;
}
