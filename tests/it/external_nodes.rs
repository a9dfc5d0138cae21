//! External nodes (added to a CKS cluster from outside) as CloudStack counts them: in `size`
//! (`KubernetesClusterAddWorker.updateKubernetesCluster`), so the cluster's nodes are
//! control + etcd + size. The node group is the CKS-provisioned workers: the target leaves the
//! external nodes out, every size sent puts them back, and the Alert rules count them as
//! CloudStack does. A scale-up of such a cluster fails on an isolated network
//! (apache/cloudstack#12633): refused before any promise unless the operator allows it.

use cks_autoscaler_provider::provider::{ExternalNodeScaleUp, Settings};
use cks_proto as pb;
use cks_sim::{ClusterSpec, NetworkKind, NodesSpec, Scenario, SimConfig, VmState};
use cks_testkit::stack::*;
use cks_testkit::*;
use std::time::Duration;
use tonic::Code;

/// "mixed": 3 workers and 2 external nodes (size 5), no CKS autoscaling, on `network`.
fn mixed_on(network: NetworkKind) -> SimConfig {
    let mut spec = ClusterSpec::new("mixed", 1, 3);
    spec.external = NodesSpec::Count(2);
    spec.network = network;
    let mut cfg = sim_config();
    cfg.settings.job_duration = Duration::from_millis(300);
    cfg.scenario = Scenario::with_cluster(spec);
    cfg
}

fn mixed() -> SimConfig {
    mixed_on(NetworkKind::Isolated)
}

/// The operator's word that the cluster's network needs no rules.
fn allowing(s: &mut Settings) {
    s.groups[0].min = 1;
    s.external_node_scale_up = ExternalNodeScaleUp::Allow;
}

fn as_node(v: &(String, String, VmState)) -> pb::ExternalGrpcNode {
    node(&format!("external-cloudstack://{}", v.0), &v.1)
}

fn sizes_sent(env: &Stack) -> Vec<String> {
    env.scale_requests()
        .iter()
        .filter_map(|r| r.get("size").cloned())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_scale_up_with_external_nodes_is_refused_before_any_promise() {
    let mut env = Stack::refreshed(mixed(), "mixed", |s| s.groups[0].min = 1).await;
    assert_eq!(env.cluster_size(), 5);
    let externals = env.vms_named("external");
    assert_eq!(externals.len(), 2);
    assert_eq!(env.target().await, 3, "external nodes are not the group's");
    assert_eq!(env.instances().await.len(), 3);
    assert_eq!(env.group_for(as_node(&externals[0])).await.id, "");
    let e = env.delete(vec![as_node(&externals[0])]).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());

    let e = env.increase(2).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    for part in [
        "apache/cloudstack#12633",
        &externals[0].1,
        "--external-node-scale-up=allow",
    ] {
        assert!(e.message().contains(part), "{part}: {}", e.message());
    }
    assert!(
        env.scale_requests().is_empty(),
        "nothing reached CloudStack"
    );
    assert_eq!(env.target().await, 3);

    // Removals go on: CloudStack removes the worker and keeps the external nodes.
    let w = env.workers()[0].clone();
    env.delete(vec![as_node(&w)])
        .await
        .expect("remove a worker");
    assert_eq!(env.target().await, 2);
    wait_until("the worker to go", async || {
        env.sim.running_jobs(&env.cluster_id) == 0
            && !env.workers().iter().any(|v| v.0 == w.0)
            && env.cluster_state() == "Running"
    })
    .await;
    env.refresh().await.unwrap();
    assert_eq!((env.target().await, env.cluster_size()), (2, 4));
    assert_eq!(env.vms_named("external").len(), 2);
    env.shutdown().await;
}

/// Allowed, on an isolated network: CloudStack creates the VMs, fails on the network rules and
/// leaves the cluster in Alert with the size unchanged (the simulator as apache/cloudstack#12633
/// shows it). The provider reports the new VMs as failed creations and sends no other
/// scale-up of the cluster while it lists external nodes.
#[tokio::test(start_paused = true)]
async fn allowed_on_an_isolated_network_the_failure_is_reported_and_remembered() {
    let mut env = Stack::refreshed(mixed(), "mixed", allowing).await;
    env.increase(1)
        .await
        .expect("sent, as the operator allowed");
    assert_eq!(sizes_sent(&env), ["6"]);
    wait_until("the job to fail", async || {
        env.sim.running_jobs(&env.cluster_id) == 0
    })
    .await;
    env.wait_state("Alert").await;
    env.wait_settled().await;
    env.refresh().await.unwrap();
    assert_eq!(env.cluster_size(), 5, "CloudStack did not raise the size");
    assert_eq!(env.workers().len(), 4, "the new VM stays");
    let failed: Vec<_> = env
        .instances()
        .await
        .into_iter()
        .filter(|i| error_of(i).is_some())
        .collect();
    assert_eq!(failed.len(), 1, "the scale-up's VM is a failed creation");

    let e = env.increase(1).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert!(
        e.message().contains("unable to update network rules"),
        "{}",
        e.message()
    );
    assert_eq!(sizes_sent(&env), ["6"], "no second scale-up");
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn on_a_shared_network_the_group_scales_and_sizes_sent_count_the_external_nodes() {
    let mut env = Stack::refreshed(mixed_on(NetworkKind::Shared), "mixed", allowing).await;
    env.increase(2).await.expect("scale up");
    assert_eq!(env.target().await, 5);
    assert_eq!(sizes_sent(&env), ["7"], "target + external nodes");
    env.wait_settled().await;
    env.refresh().await.unwrap();
    assert_eq!(env.target().await, 5);
    assert_eq!(env.cluster_size(), 7);
    assert_eq!(env.cluster_state(), "Running");
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn in_alert_external_nodes_count_as_cloudstack_counts_them() {
    let mut env = Stack::refreshed(mixed_on(NetworkKind::Shared), "mixed", allowing).await;
    // A stopped external node alone: Alert, but no worker is down (CKS Alert rule 7).
    let ext = env.vms_named("external")[0].clone();
    assert!(env.sim.stop_vm(&ext.0));
    env.sim.scan_now();
    env.wait_state("Alert").await;
    env.refresh().await.unwrap();
    let e = env.increase(1).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert!(e.message().contains("rule 7"), "{}", e.message());

    // A worker down too: scaling is allowed, the VM count (external nodes included) matching
    // control + etcd + size (CKS Alert rule 5 does not refuse).
    let w = env.workers()[0].clone();
    assert!(env.sim.stop_vm(&w.0));
    env.sim.scan_now();
    env.refresh().await.unwrap();
    env.increase(1).await.expect("scale up in Alert");
    assert_eq!(sizes_sent(&env), ["6"]);
    env.wait_settled().await;
    env.refresh().await.unwrap();
    assert_eq!(env.target().await, 4);
    // The down worker goes by nodeids; the external node stays.
    env.delete(vec![as_node(&w)])
        .await
        .expect("remove the down worker");
    wait_until("the down worker to go", async || {
        env.sim.running_jobs(&env.cluster_id) == 0 && !env.workers().iter().any(|v| v.0 == w.0)
    })
    .await;
    env.refresh().await.unwrap();
    assert_eq!(env.target().await, 3);
    assert!(env.vms_named("external").iter().any(|v| v.0 == ext.0));
    assert!(
        env.scale_requests()
            .iter()
            .all(|r| r.get("nodeids").is_none_or(|ids| !ids.contains(&ext.0)))
    );
    env.shutdown().await;
}

/// An externally managed cluster (`clustertype` ExternalManaged): CloudStack's scale job fails
/// for it (`KubernetesClusterManagerImpl.validateKubernetesClusterScaleParameters`), so the
/// provider says so in the group's debug line and refuses every scale request itself.
#[tokio::test(start_paused = true)]
async fn an_externally_managed_cluster_is_listed_but_never_scaled() {
    let mut spec = ClusterSpec::new("byo", 1, 3);
    spec.externally_managed = true;
    let mut cfg = sim_config();
    cfg.scenario = Scenario::with_cluster(spec);
    let mut env = Stack::refreshed(cfg, "byo", |s| s.groups[0].min = 1).await;
    assert_eq!(env.cluster()["clustertype"], "ExternalManaged");
    assert_eq!(env.target().await, 3);
    let debug = env.provider.all_groups().node_groups().remove(0).debug;
    assert!(debug.contains("externally managed"), "{debug}");
    let e = env.increase(1).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert!(
        e.message().contains("externally managed"),
        "{}",
        e.message()
    );
    let w = env.workers()[0].clone();
    let e = env.delete(vec![as_node(&w)]).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert!(
        env.scale_requests().is_empty(),
        "nothing reached CloudStack"
    );
    // CloudStack itself refuses it inside the job, as the provider expected.
    let cs = cks_testkit::cs::Client::new(&env.sim);
    let job = cs
        .ok(
            "scaleKubernetesCluster",
            &[("id", env.cluster_id.as_str()), ("size", "4")],
        )
        .await;
    let done = cs.wait_job(job["jobid"].as_str().expect("jobid")).await;
    assert_eq!(done["jobstatus"], 2, "{done}");
    assert!(
        done["jobresult"]["errortext"]
            .as_str()
            .is_some_and(|t| t.contains("not supported for an externally managed cluster")),
        "{done}"
    );
    env.shutdown().await;
}
