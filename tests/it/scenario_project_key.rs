//! The key CKS puts in a project cluster's `cloudstack-secret` (CloudStack 4.19.3 / 4.20.1 on:
//! the Project Kubernetes Service Role, `KubernetesClusterManagerImpl.
//! PROJECT_KUBERNETES_ACCOUNT_ROLE_ALLOWED_APIS`) may call only `listKubernetesClusters`,
//! `scaleKubernetesCluster`, `queryAsyncJobResult` and `listVirtualMachines`; the simulator
//! answers anything else 432. With that key the provider does its whole job: the template node
//! (from a worker VM's sizes), a scale-up, a scale-down with a drain, the verdict kept; each
//! optional command is tried once, and what is lost is said once.

use cks_autoscaler_provider::optional_rpcs::ProviderExtras;
use cks_proto as pb;
use cks_sim::KeyRole;
use cks_testkit::stack::*;
use cks_testkit::*;
use prost::Message;
use std::collections::BTreeMap;
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
