//! External nodes (added to a CKS cluster from outside) as CloudStack counts them: in `size`
//! (`KubernetesClusterAddWorker.updateKubernetesCluster`), so the cluster's nodes are
//! control + etcd + size. The node group is the CKS-provisioned workers: the target leaves the
//! external nodes out, every size sent puts them back, and the Alert rules count them as
//! CloudStack does.

use cks_proto as pb;
use cks_sim::{ClusterSpec, NodesSpec, Scenario, SimConfig, VmState};
use cks_testkit::stack::*;
use cks_testkit::*;
use std::time::Duration;
use tonic::Code;

/// "mixed": 3 workers and 2 external nodes (size 5), no CKS autoscaling.
fn mixed() -> SimConfig {
    let mut spec = ClusterSpec::new("mixed", 1, 3);
    spec.external = NodesSpec::Count(2);
    let mut cfg = sim_config();
    cfg.settings.job_duration = Duration::from_millis(300);
    cfg.scenario = Scenario::with_cluster(spec);
    cfg
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
async fn the_group_is_the_cks_workers_and_sizes_sent_count_the_external_nodes() {
    let mut env = Stack::refreshed(mixed(), "mixed", |s| s.groups[0].min = 1).await;
    assert_eq!(env.cluster_size(), 5);
    let externals = env.vms_named("external");
    assert_eq!(externals.len(), 2);
    assert_eq!(env.target().await, 3, "external nodes are not the group's");
    assert_eq!(env.instances().await.len(), 3);
    assert_eq!(env.group_for(as_node(&externals[0])).await.id, "");
    let e = env.delete(vec![as_node(&externals[0])]).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());

    env.increase(2).await.expect("scale up");
    assert_eq!(env.target().await, 5);
    assert_eq!(sizes_sent(&env), ["7"], "target + external nodes");
    env.wait_settled().await;
    env.refresh().await.unwrap();
    assert_eq!(env.target().await, 5);
    assert_eq!(env.cluster_size(), 7);

    let w = env.workers()[0].clone();
    env.delete(vec![as_node(&w)])
        .await
        .expect("remove a worker");
    assert_eq!(env.target().await, 4);
    wait_until("the worker to go", async || {
        env.sim.running_jobs(&env.cluster_id) == 0
            && !env.workers().iter().any(|v| v.0 == w.0)
            && env.cluster_state() == "Running"
    })
    .await;
    env.refresh().await.unwrap();
    assert_eq!((env.target().await, env.cluster_size()), (4, 6));
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn in_alert_external_nodes_count_as_cloudstack_counts_them() {
    let mut env = Stack::refreshed(mixed(), "mixed", |s| s.groups[0].min = 1).await;
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
