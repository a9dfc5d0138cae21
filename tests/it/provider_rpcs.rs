//! Every externalgrpc RPC through a generated tonic client, against the simulator.

use cks_proto as pb;
use cks_proto::instance_status::InstanceState;
use cks_sim::{ClusterSpec, JobFailure, NodesSpec, Scenario, VmState};
use cks_testkit::*;
use std::time::Duration;
use tonic::Code;

#[tokio::test(start_paused = true)]
async fn node_groups_list_the_worker_pool_with_min_max_and_a_debug_line() {
    let mut env = Stack::demo_default().await;
    let groups = env
        .client
        .node_groups(pb::NodeGroupsRequest {})
        .await
        .unwrap()
        .into_inner()
        .node_groups;
    assert_eq!(groups.len(), 1);
    let g = &groups[0];
    assert_eq!(g.id, env.cluster_id);
    // CKS autoscaling is enabled on the demo cluster with min 1 max 10.
    assert_eq!((g.min_size, g.max_size), (1, 10));
    assert!(
        g.debug.contains("demo") && g.debug.contains("Running") && g.debug.contains("3 running"),
        "{}",
        g.debug
    );
    assert!(!g.debug.contains('\n'));
    assert_eq!(env.target().await, 3);
    let instances = env.instances().await;
    assert_eq!(instances.len(), 3);
    for i in &instances {
        assert!(i.id.starts_with("external-cloudstack://"), "{}", i.id);
        assert_eq!(state_of(i), InstanceState::InstanceRunning);
        assert!(error_of(i).is_none());
    }
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn node_group_for_node_matches_workers_and_leaves_others_unmanaged() {
    let mut env = Stack::demo_default().await;
    let (wid, wname, _) = env.workers()[0].clone();
    let (cid, cname) = env.control();
    for n in [
        node(&format!("external-cloudstack://{wid}"), &wname),
        node(&format!("cloudstack://{wid}"), "whatever"),
        node(&wid, ""),
        node("", &wname.to_uppercase()),
        fake_node(&format!("external-cloudstack://{wid}"), "unregistered"),
    ] {
        let g = env.group_for(n.clone()).await;
        assert_eq!(g.id, env.cluster_id, "{n:?}");
        assert_eq!((g.min_size, g.max_size), (1, 10));
    }
    for n in [
        node(&format!("external-cloudstack://{cid}"), &cname),
        node("", &cname),
        node(
            "external-cloudstack://00000000-0000-0000-0000-000000000000",
            "stranger",
        ),
        node("aws:///eu-west-1a/i-123", &wname),
        node("", "stranger"),
    ] {
        assert_eq!(env.group_for(n.clone()).await.id, "", "{n:?}");
    }
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn increase_size_sends_size_only_answers_at_once_and_the_target_follows_the_job() {
    let mut cfg = sim_config();
    cfg.settings.job_duration = Duration::from_millis(600);
    let mut env = Stack::refreshed(cfg, "demo", |_| {}).await;
    let t0 = std::time::Instant::now();
    env.increase(2).await.expect("increase");
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "IncreaseSize took {:?}",
        t0.elapsed()
    );
    assert_eq!(
        env.target().await,
        5,
        "the target shows the request at once"
    );
    let reqs = env.scale_requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    let keys: Vec<&str> = reqs[0]
        .keys()
        .map(String::as_str)
        .filter(|k| !matches!(*k, "command" | "response"))
        .collect();
    assert_eq!(keys, vec!["id", "size"], "only id and size are sent");
    assert_eq!(reqs[0]["size"], "5");
    let creating = env
        .instances()
        .await
        .iter()
        .filter(|i| state_of(i) == InstanceState::InstanceCreating)
        .count();
    assert_eq!(creating, 2, "requested VMs show as creating");
    wait_until("the scale job to finish", || {
        let s = env.sim.cluster_json(&env.cluster_id);
        async move { s["size"] == 5 && s["state"] == "Running" }
    })
    .await;
    wait_until("the provider to see the job end", || {
        let p = env.provider.clone();
        let id = env.cluster_id.clone();
        async move {
            p.all_groups()
                .nodes(&id)
                .map(|n| {
                    n.len() == 5
                        && n.iter()
                            .all(|i| i.state == cks_domain::status::InstanceState::Running)
                })
                .unwrap_or(false)
        }
    })
    .await;
    env.refresh().await.unwrap();
    assert_eq!(env.target().await, 5);
    assert_eq!(env.scale_requests().len(), 1, "nothing sent twice");
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn bad_increase_requests_are_refused_without_calling_cloudstack() {
    let mut env = Stack::demo_default().await;
    let e = env.increase(0).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = env.increase(-2).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = env.increase(8).await.unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange);
    assert!(
        e.message().contains("11") && e.message().contains("10"),
        "{}",
        e.message()
    );
    let mut unknown = tonic::Request::new(pb::NodeGroupIncreaseSizeRequest {
        delta: 1,
        id: "nope".into(),
    });
    unknown.set_timeout(Duration::from_secs(5));
    assert_eq!(
        env.client
            .node_group_increase_size(unknown)
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    assert!(env.scale_requests().is_empty());
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_stopped_worker_is_listed_running_and_the_cluster_still_scales_in_alert() {
    let mut env = Stack::demo_default().await;
    let (wid, wname, _) = env.workers()[1].clone();
    assert!(env.sim.stop_vm(&wid));
    env.sim.scan_now();
    wait_until("Alert", || {
        let s = env.cluster_state();
        async move { s == "Alert" }
    })
    .await;
    env.refresh().await.unwrap();
    let instances = env.instances().await;
    let down = instances
        .iter()
        .find(|i| i.id.ends_with(&wid))
        .expect("down worker listed");
    // Running with no error: an error would make upstream stop expecting its node
    // (expectedToRegister, clusterstate.go). The provider itself counts it down.
    assert_eq!(state_of(down), InstanceState::InstanceRunning);
    assert!(error_of(down).is_none(), "{down:?}");
    assert!(provider_sees_down(&env.provider, &env.cluster_id, &wid));
    assert_eq!(
        env.target().await,
        3,
        "a down worker still counts in the size"
    );

    env.increase(1)
        .await
        .expect("Alert permits a size change while a worker is down");
    assert_eq!(env.target().await, 4);
    wait_until("scale-up done", || {
        let s = env.sim.cluster_json(&env.cluster_id);
        async move { s["size"] == 4 }
    })
    .await;
    wait_until("provider idle", || {
        let p = env.provider.clone();
        let id = env.cluster_id.clone();
        async move {
            p.all_groups()
                .nodes(&id)
                .map(|n| {
                    n.iter()
                        .all(|i| i.state != cks_domain::status::InstanceState::Creating)
                })
                .unwrap_or(false)
        }
    })
    .await;
    env.refresh().await.unwrap();
    // The autoscaler removes the NotReady node through DeleteNodes with the real node.
    env.delete(vec![node(&format!("external-cloudstack://{wid}"), &wname)])
        .await
        .expect("remove the down worker");
    assert_eq!(env.target().await, 3);
    let last = env.scale_requests().last().cloned().unwrap();
    assert_eq!(last.get("nodeids").map(String::as_str), Some(wid.as_str()));
    assert!(!last.contains_key("size"));
    // Idempotent: the same node again sends nothing new.
    let before = env.scale_requests().len();
    env.delete(vec![node(&format!("external-cloudstack://{wid}"), &wname)])
        .await
        .expect("repeat is accepted");
    assert_eq!(env.scale_requests().len(), before);
    env.sim.scan_now();
    wait_until("back to Running", || {
        let s = env.sim.cluster_json(&env.cluster_id);
        async move { s["state"] == "Running" && s["size"] == 3 }
    })
    .await;
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn alert_with_the_control_plane_down_is_refused_locally_naming_the_vm() {
    let mut env = Stack::demo_default().await;
    let (cid, cname) = env.control();
    assert!(env.sim.stop_vm(&cid));
    env.sim.scan_now();
    wait_until("Alert", || {
        let s = env.cluster_state();
        async move { s == "Alert" }
    })
    .await;
    env.refresh().await.unwrap();
    env.sim.reset_requests();
    let e = env.increase(1).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains(&cname), "{}", e.message());
    let (wid, wname, _) = env.workers()[0].clone();
    let e = env
        .delete(vec![node(&format!("external-cloudstack://{wid}"), &wname)])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        env.scale_requests().is_empty(),
        "nothing reached CloudStack"
    );
    let groups = env
        .client
        .node_groups(pb::NodeGroupsRequest {})
        .await
        .unwrap()
        .into_inner()
        .node_groups;
    assert!(
        groups[0].debug.contains("cannot scale"),
        "{}",
        groups[0].debug
    );
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn control_etcd_and_unknown_nodes_are_never_deleted() {
    let mut spec = ClusterSpec::new("ha", 1, 3);
    spec.etcd = NodesSpec::Count(1);
    let mut cfg = sim_config();
    cfg.scenario = Scenario::with_cluster(spec);
    let mut env = Stack::refreshed(cfg, "ha", |s| s.groups[0].min = 1).await;
    let (cid, cname) = env.control();
    let e = env
        .delete(vec![node(&format!("external-cloudstack://{cid}"), &cname)])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    let etcd = env
        .sim
        .vms(&env.cluster_id)
        .into_iter()
        .find(|(_, n, _)| n.contains("etcd"))
        .expect("etcd vm");
    let e = env
        .delete(vec![node(
            &format!("external-cloudstack://{}", etcd.0),
            &etcd.1,
        )])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    let e = env
        .delete(vec![node("external-cloudstack://nope", "nope")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    // A mixed request is refused whole.
    let (wid, wname, _) = env.workers()[0].clone();
    let e = env
        .delete(vec![
            node(&format!("external-cloudstack://{wid}"), &wname),
            node("", &cname),
        ])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(env.scale_requests().is_empty());
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn deleting_below_the_minimum_is_refused() {
    let mut env = Stack::refreshed(sim_config(), "demo", |s| s.groups[0].min = 3).await;
    // The demo cluster has CKS autoscaling on (min 1): its own min wins, so use a cluster
    // without autoscaling for the --nodes minimum.
    let ws = env.workers();
    let nodes: Vec<_> = ws
        .iter()
        .take(3)
        .map(|(id, n, _)| node(&format!("external-cloudstack://{id}"), n))
        .collect();
    let e = env.delete(nodes).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert!(e.message().contains("minimum"), "{}", e.message());
    assert!(env.scale_requests().is_empty());
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_capacity_failure_is_reported_as_out_of_resources_and_cleared_by_deleting_placeholders() {
    let mut cfg = sim_config();
    cfg.settings.job_failure = JobFailure::Capacity;
    let mut env = Stack::refreshed(cfg, "demo", |s| s.scale_watch = Duration::from_millis(1)).await;
    env.increase(2)
        .await
        .expect("accepted: the job fails later");
    wait_until("failed instances", || {
        let p = env.provider.clone();
        let id = env.cluster_id.clone();
        async move {
            p.all_groups()
                .nodes(&id)
                .map(|n| n.iter().filter(|i| i.error.is_some()).count() == 2)
                .unwrap_or(false)
        }
    })
    .await;
    let failed: Vec<pb::Instance> = env
        .instances()
        .await
        .into_iter()
        .filter(|i| error_of(i).is_some())
        .collect();
    for f in &failed {
        assert_eq!(state_of(f), InstanceState::InstanceCreating);
        assert_eq!(
            error_of(f).unwrap().instance_error_class,
            1,
            "OutOfResources"
        );
    }
    assert_eq!(
        env.target().await,
        5,
        "failed instances count until the autoscaler deletes them"
    );
    let before = env.scale_requests().len();
    env.delete(
        failed
            .iter()
            .map(|f| fake_node(&f.id, "create-error"))
            .collect(),
    )
    .await
    .expect("delete failed");
    assert_eq!(env.target().await, 3, "target returns to what exists");
    assert_eq!(
        env.scale_requests().len(),
        before,
        "placeholders are dropped without calling CloudStack"
    );
    assert_eq!(env.instances().await.len(), 3);
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn decrease_target_size_only_cancels_what_does_not_exist() {
    let mut cfg = sim_config();
    cfg.settings.job_duration = Duration::from_secs(5);
    let mut env = Stack::refreshed(cfg, "demo", |_| {}).await;
    env.increase(1).await.unwrap();
    env.increase(2)
        .await
        .expect("queued behind the running job");
    assert_eq!(env.target().await, 6);
    assert_eq!(
        env.scale_requests().len(),
        1,
        "the second request waits for the first job"
    );
    let dec = |d: i32, id: String| pb::NodeGroupDecreaseTargetSizeRequest { delta: d, id };
    let e = env
        .client
        .node_group_decrease_target_size(dec(1, env.cluster_id.clone()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    // More than can be cancelled (the running job's node cannot be): refused, nothing
    // changes. An OK that left the target where it was would make the core's
    // fixNodeGroupSize act again every loop, skipping the rest of each.
    let e = env
        .client
        .node_group_decrease_target_size(dec(-3, env.cluster_id.clone()))
        .await
        .expect_err("cannot cancel the running job's node");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message().contains("only 2 requested node(s)"),
        "{}",
        e.message()
    );
    assert_eq!(env.target().await, 6);
    env.client
        .node_group_decrease_target_size(dec(-2, env.cluster_id.clone()))
        .await
        .expect("the queued two are cancelled");
    assert_eq!(env.target().await, 4);
    let e = env
        .client
        .node_group_decrease_target_size(dec(-1, env.cluster_id.clone()))
        .await
        .expect_err("nothing left to cancel");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert_eq!(env.target().await, 4);
    env.wait_settled().await;
    env.wait_provider_settled().await;
    assert_eq!(
        env.scale_requests().len(),
        1,
        "the cancelled increases were never sent"
    );
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn concurrent_increases_never_run_two_jobs_and_are_merged() {
    let mut cfg = sim_config();
    cfg.settings.job_duration = Duration::from_millis(300);
    let env = Stack::refreshed(cfg, "demo", |_| {}).await;
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let mut c = env.client.clone();
        let id = env.cluster_id.clone();
        tasks.push(tokio::spawn(async move {
            let mut r = tonic::Request::new(pb::NodeGroupIncreaseSizeRequest { delta: 1, id });
            r.set_timeout(Duration::from_secs(5));
            c.node_group_increase_size(r).await.map(|_| ())
        }));
    }
    let mut ok = 0;
    for t in tasks {
        if t.await.unwrap().is_ok() {
            ok += 1;
        }
    }
    assert_eq!(ok, 6);
    wait_until("size 9, Running", async || {
        assert!(
            env.sim.running_jobs(&env.cluster_id) <= 1,
            "two scale jobs at once"
        );
        let s = env.sim.cluster_json(&env.cluster_id);
        s["size"] == 9 && s["state"] == "Running"
    })
    .await;
    let sizes: Vec<String> = env
        .scale_requests()
        .iter()
        .map(|r| r["size"].clone())
        .collect();
    assert!(sizes.len() <= 3, "requests were merged: {sizes:?}");
    assert_eq!(sizes.last().map(String::as_str), Some("9"));
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn refresh_serves_a_recent_snapshot_while_cloudstack_is_down_then_reports_unavailable() {
    // The provider's snapshot is taken after this instant: its age is at most `t0.elapsed()`.
    let t0 = tokio::time::Instant::now();
    let mut env = Stack::refreshed(sim_config(), "demo", |s| {
        s.staleness_bound = Duration::from_millis(400);
    })
    .await;
    env.sim.configure(|s| s.error_rate = 1.0);
    env.refresh()
        .await
        .expect("a snapshot within the staleness bound is served");
    assert_eq!(env.target().await, 3);
    wait_until(
        "Refresh to report CloudStack unavailable",
        async || match env.refresh().await {
            Ok(()) => {
                assert!(
                    t0.elapsed() < Duration::from_secs(30),
                    "a snapshot far older than the bound is still served"
                );
                false
            }
            Err(e) => {
                assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
                assert!(
                    t0.elapsed() >= Duration::from_millis(400),
                    "a snapshot younger than the bound was refused"
                );
                true
            }
        },
    )
    .await;
    // Reads still answer from memory.
    assert_eq!(env.target().await, 3);
    let e = env.increase(1).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    // CloudStack answers again: the provider's own retry, within its backoff, brings a fresh
    // snapshot (a Refresh during the backoff starts no round of its own).
    env.sim.configure(|s| s.error_rate = 0.0);
    let back = tokio::time::Instant::now();
    wait_until("Refresh to recover", async || env.refresh().await.is_ok()).await;
    assert!(
        back.elapsed() <= Duration::from_secs(5),
        "{:?}",
        back.elapsed()
    );
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_vm_whose_node_has_another_provider_id_is_reported_under_it_and_never_deleted_as_unregistered()
 {
    let mut env = Stack::demo_default().await;
    let (wid, wname, _) = env.workers()[0].clone();
    // The node registered without the CCM's providerID convention.
    let g = env
        .group_for(node(&format!("openstack:///{wid}-x"), &wname))
        .await;
    assert_eq!(g.id, "", "a providerID of another provider is not ours");
    let g = env.group_for(node("", &wname)).await;
    assert_eq!(g.id, env.cluster_id);
    // The autoscaler sees the instance as unregistered and tries to delete it with a fake node.
    let e = env
        .delete(vec![fake_node(
            &format!("external-cloudstack://{wid}"),
            "unregistered",
        )])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains(&wname), "{}", e.message());
    assert!(env.scale_requests().is_empty());
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn alert_scaling_off_passes_cloudstacks_refusal_through_once_then_refuses_locally() {
    let mut cfg = sim_config();
    cfg.settings.alert_scaling = false;
    let mut env = Stack::refreshed(cfg, "demo", |_| {}).await;
    let (wid, _, _) = env.workers()[0].clone();
    env.sim.stop_vm(&wid);
    env.sim.scan_now();
    wait_until("Alert", || {
        let s = env.cluster_state();
        async move { s == "Alert" }
    })
    .await;
    env.refresh().await.unwrap();
    let e = env.increase(1).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message().contains("Alert state and can not be scaled"),
        "{}",
        e.message()
    );
    assert!(
        e.message().contains("does not scale clusters in Alert"),
        "{}",
        e.message()
    );
    assert_eq!(env.scale_requests().len(), 1);
    assert_eq!(
        env.target().await,
        3,
        "a refused request leaves the target alone"
    );
    let e = env.increase(1).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert_eq!(
        env.scale_requests().len(),
        1,
        "no retry storm: refused locally"
    );
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_restarted_provider_adopts_the_running_job_and_sends_nothing_twice() {
    let mut cfg = sim_config();
    cfg.settings.job_duration = Duration::from_millis(1500);
    let mut env = Stack::refreshed(cfg, "demo", |_| {}).await;
    env.increase(2).await.unwrap();
    // A second provider process: it knows nothing of the job.
    let settings = fast_settings(&env.cluster_id, 1, 10);
    let (mut p2, mut c2) = start_provider(&env.sim, settings).await;
    c2.refresh(pb::RefreshRequest {}).await.unwrap();
    let t = c2
        .node_group_target_size(pb::NodeGroupTargetSizeRequest {
            id: env.cluster_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .target_size;
    assert!(t >= 3);
    let mut r = tonic::Request::new(pb::NodeGroupIncreaseSizeRequest {
        delta: 1,
        id: env.cluster_id.clone(),
    });
    r.set_timeout(Duration::from_secs(5));
    let res = c2.node_group_increase_size(r).await;
    assert!(res.is_ok(), "queued behind the adopted job: {res:?}");
    assert_eq!(
        env.scale_requests().len(),
        1,
        "nothing sent while the adopted job runs"
    );
    wait_until("both requests done", || {
        let s = env.sim.cluster_json(&env.cluster_id);
        async move { s["size"] == 6 && s["state"] == "Running" }
    })
    .await;
    assert_eq!(env.scale_requests().len(), 2);
    p2.stop().await;
    env.refresh().await.unwrap();
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn gpu_and_optional_rpcs_answer_as_the_autoscaler_expects() {
    let mut env = Stack::demo_default().await;
    let l = env
        .client
        .gpu_label(pb::GpuLabelRequest {})
        .await
        .expect("GPULabel succeeds")
        .into_inner();
    assert_eq!(l.label, "");
    let t = env
        .client
        .get_available_gpu_types(pb::GetAvailableGpuTypesRequest {})
        .await
        .expect("succeeds")
        .into_inner();
    assert!(t.gpu_types.is_empty());
    let e = env
        .client
        .pricing_node_price(pb::PricingNodePriceRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
    env.client
        .cleanup(pb::CleanupRequest {})
        .await
        .expect("cleanup");
    env.shutdown().await;
}

#[allow(dead_code)]
fn _uses(_: VmState) {}

#[tokio::test(start_paused = true)]
async fn template_node_info_describes_a_new_worker_from_the_offering() {
    use cks_autoscaler_provider::optional_rpcs::ProviderExtras;
    use cks_autoscaler_provider::server::ServeOptions;
    use prost::Message;
    let sim = cks_sim::spawn(sim_config()).await.unwrap();
    let id = sim.cluster_id("demo").unwrap();
    let mut extras = ProviderExtras::default();
    extras.overrides.insert(
        "demo".into(),
        cks_autoscaler_provider::options::parse_overrides_spec("demo:scale-down-unneeded=5m")
            .unwrap()
            .1,
    );
    let options = ServeOptions {
        extras: std::sync::Arc::new(extras),
        ..ServeOptions::default()
    };
    let (mut server, mut client) =
        start_provider_with(&sim, fast_settings(&id, 1, 10), options).await;
    client.refresh(pb::RefreshRequest {}).await.unwrap();
    let bytes = client
        .node_group_template_node_info(pb::NodeGroupTemplateNodeInfoRequest { id: id.clone() })
        .await
        .expect("template")
        .into_inner()
        .node_bytes;
    assert!(!bytes.is_empty());
    let node =
        k8s_pb::api::core::v1::Node::decode(bytes.as_slice()).expect("Kubernetes protobuf Node");
    let status = node.status.expect("status");
    let cap = status.capacity;
    assert!(
        cap.contains_key("cpu") && cap.contains_key("memory") && cap.contains_key("pods"),
        "{cap:?}"
    );
    let labels = node.metadata.expect("metadata").labels;
    assert_eq!(
        labels
            .get("node.kubernetes.io/instance-type")
            .map(String::as_str),
        Some("cks-medium")
    );
    assert!(labels.contains_key("topology.kubernetes.io/zone"));
    let ready = status
        .conditions
        .iter()
        .find(|c| c.r#type.as_deref() == Some("Ready"))
        .expect("Ready");
    assert_eq!(ready.status.as_deref(), Some("True"));
    // GetOptions: overrides win, every other field echoes the request's defaults.
    let defaults = pb::NodeGroupAutoscalingOptions {
        scale_down_utilization_threshold: 0.42,
        scale_down_unready_duration: Some(prost_types::Duration {
            seconds: 1200,
            nanos: 0,
        }),
        max_node_provision_duration: Some(prost_types::Duration {
            seconds: 900,
            nanos: 0,
        }),
        ..Default::default()
    };
    let o = client
        .node_group_get_options(pb::NodeGroupAutoscalingOptionsRequest {
            id: id.clone(),
            defaults: Some(defaults),
        })
        .await
        .expect("options")
        .into_inner()
        .node_group_autoscaling_options
        .expect("options");
    assert_eq!(o.scale_down_utilization_threshold, 0.42);
    assert_eq!(o.scale_down_unneeded_duration.map(|d| d.seconds), Some(300));
    assert_eq!(o.scale_down_unready_duration.map(|d| d.seconds), Some(1200));
    assert_eq!(o.max_node_provision_duration.map(|d| d.seconds), Some(900));
    // Releases up to 1.34.1 read the durations from fields 3-5 (nanoseconds).
    assert_eq!(
        o.max_node_provision_time.and_then(|d| d.duration),
        Some(900_000_000_000)
    );
    server.stop().await;
    sim.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn get_options_without_overrides_is_unimplemented_so_the_autoscaler_keeps_its_flags() {
    let mut env = Stack::demo_default().await;
    let e = env
        .client
        .node_group_get_options(pb::NodeGroupAutoscalingOptionsRequest {
            id: env.cluster_id.clone(),
            defaults: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
    env.shutdown().await;
}

/// A template that cannot be built is Unimplemented, not an error: any other code makes the
/// autoscaler abort its whole loop while a group has no node to copy.
#[tokio::test(start_paused = true)]
async fn a_template_that_cannot_be_built_is_unimplemented_with_the_reason() {
    use cks_autoscaler_provider::optional_rpcs::ProviderExtras;
    use cks_autoscaler_provider::server::ServeOptions;
    let sim = cks_sim::spawn(sim_config()).await.unwrap();
    let id = sim.cluster_id("demo").unwrap();
    let mut extras = ProviderExtras::default();
    if let Some(t) = extras.template.as_mut() {
        t.system_reserved.memory_mib = 1_000_000;
    }
    let options = ServeOptions {
        extras: std::sync::Arc::new(extras),
        ..ServeOptions::default()
    };
    let (mut server, mut client) =
        start_provider_with(&sim, fast_settings(&id, 1, 10), options).await;
    client.refresh(pb::RefreshRequest {}).await.unwrap();
    let e = client
        .node_group_template_node_info(pb::NodeGroupTemplateNodeInfoRequest { id: id.clone() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented, "{}", e.message());
    assert!(e.message().contains("memory"), "{}", e.message());
    // An unknown group is still an error of its own.
    let e = client
        .node_group_template_node_info(pb::NodeGroupTemplateNodeInfoRequest {
            id: "no-such-group".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{}", e.message());
    server.stop().await;
    sim.shutdown().await;
}

async fn debug_line(env: &mut Stack) -> String {
    env.client
        .node_groups(pb::NodeGroupsRequest {})
        .await
        .expect("node groups")
        .into_inner()
        .node_groups
        .remove(0)
        .debug
}

/// Read answers are built once per state change and reused; every change (a refresh, a scale
/// request) shows at once in the next answer, never a stale one.
#[tokio::test(start_paused = true)]
async fn repeated_reads_follow_every_state_change_at_once() {
    let mut env = Stack::demo_default().await;
    let (wid, wname, _) = env.workers()[0].clone();
    let worker = node(&format!("external-cloudstack://{wid}"), &wname);
    for _ in 0..3 {
        let g = env.group_for(worker.clone()).await;
        assert!(
            g.debug
                .contains("3 running, 0 creating, 0 deleting, 0 down"),
            "{}",
            g.debug
        );
        assert_eq!(env.instances().await.len(), 3);
    }
    // A VM goes down: the next refresh shows it in every answer.
    assert!(env.sim.stop_vm(&wid));
    env.refresh().await.unwrap();
    let g = env.group_for(worker.clone()).await;
    assert!(
        g.debug.contains("1 down") && g.debug.contains(&wname),
        "{}",
        g.debug
    );
    assert_eq!(debug_line(&mut env).await, g.debug);
    // A scale request: its placeholder and the job show without a refresh.
    env.increase(1).await.expect("scale-up accepted");
    let instances = env.instances().await;
    assert_eq!(instances.len(), 4, "{instances:?}");
    assert!(debug_line(&mut env).await.contains("scale-up 3->4"));
    assert_eq!(env.target().await, 4);
    env.shutdown().await;
}

/// The debug line travels with every NodeGroupForNode answer: it names a few down workers,
/// not all of them.
#[tokio::test(start_paused = true)]
async fn the_debug_line_names_at_most_ten_down_workers() {
    let mut spec = ClusterSpec::new("many", 1, 14);
    spec.workers = NodesSpec::States(vec![VmState::Stopped; 14]);
    let mut cfg = sim_config();
    cfg.scenario = Scenario::with_cluster(spec);
    let mut env = Stack::refreshed(cfg, "many", |s| s.groups[0].max = 20).await;
    let line = debug_line(&mut env).await;
    assert!(line.contains("14 down"), "{line}");
    assert!(line.contains("and 4 more]"), "{line}");
    assert_eq!(line.matches("Stopped").count(), 10, "{line}");
    env.shutdown().await;
}

/// Right after the provider starts (its first snapshot still on its way, CloudStack slow),
/// NodeGroupForNode waits for it within the call's deadline and names the group: autoscalers
/// 1.28 and 1.29 dereference a nil group when a deletion in flight gets "" for its node
/// (`core/scaledown/actuation/delete_in_batch.go`, guarded from 1.30).
#[tokio::test(start_paused = true)]
async fn node_group_for_node_right_after_start_waits_for_the_first_snapshot() {
    let mut cfg = sim_config();
    cfg.settings.latency = Duration::from_secs(1);
    let mut env = Stack::start(cfg, "demo", |_| {}).await;
    let worker = env.workers().remove(0);
    let _first = env.provider.spawn_keeper();
    let request = with_deadline(
        pb::NodeGroupForNodeRequest {
            node: Some(pb::ExternalGrpcNode {
                provider_id: format!("external-cloudstack://{}", worker.0),
                name: worker.1.to_lowercase(),
                ..Default::default()
            }),
        },
        Duration::from_secs(5),
    );
    let group = env
        .client
        .node_group_for_node(request)
        .await
        .expect("answered")
        .into_inner()
        .node_group
        .unwrap_or_default();
    assert_eq!(group.id, env.cluster_id, "not \"\" for a served node");
    env.shutdown().await;
}

/// A caller's input is repeated in errors only in part: a 1 MB node group id is NOT_FOUND, with
/// a message that says the id was cut, not a status too large for its header.
#[tokio::test(start_paused = true)]
async fn a_huge_node_group_id_is_not_found_and_the_message_says_it_was_cut() {
    let mut env = Stack::demo_default().await;
    let id = "x".repeat(1 << 20);
    let err = env
        .client
        .node_group_target_size(pb::NodeGroupTargetSizeRequest { id })
        .await
        .expect_err("unknown group");
    assert_eq!(err.code(), Code::NotFound, "{}", err.message());
    assert!(err.message().len() < 1024, "{} bytes", err.message().len());
    assert!(
        err.message().contains("cut: 1048576 bytes in all")
            && err.message().contains(&env.cluster_id),
        "{}",
        err.message()
    );
    env.shutdown().await;
}
