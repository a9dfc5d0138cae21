//! End-to-end scale from zero: mock autoscaler → provider → simulated CloudStack, for a CKS
//! group with no Ready node.
//!
//! CloudStack refuses a CKS cluster size below 1, so a CKS group never has zero workers; the
//! CKS form of "scale from zero" is a group whose workers are all down (the cluster in Alert,
//! which may still change its size) or whose nodes are not in Kubernetes. The autoscaler then
//! has no Ready node to copy and builds the group's node template from
//! NodeGroupTemplateNodeInfo; pending pods scale the group only if they fit that template.

use cks_autoscaler_provider::optional_rpcs::ProviderExtras;
use cks_lab::autoscaler::{
    AutoscalerConfig, Decision, FAKE_NODE_UNREGISTERED, MockAutoscaler, NodeTemplate, Observation,
    PodSpec, Request, Resources, Rpc, TemplateSource, fake_reason,
};

use cks_sim::{ClusterSpec, NodesSpec, OfferingSpec, Scenario, VmState};
use cks_testkit::stack::*;
use cks_testkit::*;
use std::sync::Arc;
use std::time::Duration;

/// The worker offering: 3 vCPU, 6144 MB. A default kubelet on it has 3 cpu, 6044Mi (less the
/// 100Mi hard eviction threshold) and 110 pods allocatable, and that is what both the
/// provider's template and the simulator's nodes must say.
const OFFERING: &str = "worker-3c-6g";
const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;

fn offering_allocatable() -> Resources {
    Resources::new(3000, 6044 * MI, 110)
}

/// A simulator with one cluster `zero`: 1 control node and one worker in `worker_state`,
/// CKS autoscaling off (so `--nodes` 0..3 applies), on [`OFFERING`].
fn zero_cluster(worker_state: VmState) -> cks_sim::SimConfig {
    let mut spec = ClusterSpec::new("zero", 1, 1);
    spec.offering = Some(OFFERING.into());
    spec.workers = NodesSpec::States(vec![worker_state]);
    let mut config = sim_config();
    config.scenario = Scenario {
        offerings: vec![OfferingSpec {
            id: None,
            name: OFFERING.into(),
            cpu: 3,
            memory: 6144,
            speed: 2000,
            customized: false,
        }],
        ..Scenario::with_cluster(spec)
    };
    config
}

/// The stack for `zero`, group min 0 max 3, the provider serving `extras`.
async fn zero_stack(worker_state: VmState, extras: Arc<ProviderExtras>) -> Stack {
    Stack::start_with_extras(
        zero_cluster(worker_state),
        "zero",
        |s| {
            s.groups[0].min = 0;
            s.groups[0].max = 3;
        },
        extras,
    )
    .await
}

/// Timers / 600 (provision time 1.5 s, startup 1.5 s), but NotReady nodes kept for a minute so
/// that scale-down does not remove the down worker while a scenario runs.
fn config() -> AutoscalerConfig {
    let mut c = autoscaler_config(600, 30, WAIT);
    c.scale_down_unready_time = Duration::from_secs(60);
    c
}

/// Stops the only worker and waits until CloudStack shows Alert and its node is NotReady.
async fn stop_the_worker(stack: &Stack) -> String {
    let workers = stack.workers();
    assert_eq!(workers.len(), 1, "{workers:?}");
    let (wid, wname, _) = workers[0].clone();
    assert!(stack.sim.stop_vm(&wid));
    stack.wait_state("Alert").await;
    let node = wname.to_ascii_lowercase();
    wait_until("the stopped worker's node to be NotReady", async || {
        stack.sim.nodes().iter().any(|n| n.name == node && !n.ready)
    })
    .await;
    node
}

fn templates(ca: &MockAutoscaler, group: &str) -> Vec<Result<NodeTemplate, String>> {
    ca.timeline()
        .templates(group)
        .into_iter()
        .map(|(_, t)| t.clone())
        .collect()
}

fn increases(ca: &MockAutoscaler) -> Vec<(String, i32)> {
    ca.calls(Rpc::NodeGroupIncreaseSize)
        .iter()
        .filter_map(|c| match &c.request {
            Request::NodeGroupIncreaseSize { id, delta } => Some((id.clone(), *delta)),
            _ => None,
        })
        .collect()
}

/// (a) The only worker is down: no Ready node, so the autoscaler builds the template from
/// NodeGroupTemplateNodeInfo (the worker offering's resources), the pending pods fit it, the
/// group grows by one, the new worker boots and takes the pods.
#[tokio::test(start_paused = true)]
async fn every_worker_down_scales_up_from_the_providers_template() {
    let stack = zero_stack(VmState::Running, Arc::new(ProviderExtras::default())).await;
    let down_node = stop_the_worker(&stack).await;
    let id = stack.cluster_id.clone();
    // A freshly started autoscaler: it never saw the worker Ready, so it has no template of
    // its own to remember.
    let mut ca = stack.autoscaler(config()).await;

    let first = ca.run_once().await;
    assert!(first.aborted.is_none(), "{first}");
    assert_eq!((first.ready, first.not_ready), (0, 1), "{first}");
    let group = &first.groups[0];
    assert_eq!((group.min_size, group.max_size, group.target), (0, 3, 1));
    assert_eq!(
        first.count(Rpc::NodeGroupTemplateNodeInfo),
        1,
        "no Ready node: the template comes from the provider\n{}",
        ca.timeline()
    );
    let template = templates(&ca, &id)
        .pop()
        .expect("template observed")
        .expect("a template");
    assert_eq!(template.source, TemplateSource::Provider);
    assert_eq!(
        template.allocatable,
        offering_allocatable(),
        "the worker offering's resources: {template}"
    );
    assert_eq!(
        template
            .labels
            .get("node.kubernetes.io/instance-type")
            .map(String::as_str),
        Some(OFFERING)
    );

    // Three pods of 1 cpu / 1.5Gi: 3 cpu and 4.5Gi, one new worker's worth.
    ca.set_pending_pods(PodSpec::replicas("web", 3, 1000, 1536 * MI));
    let up = ca.run_once().await;
    assert_eq!(
        increases(&ca),
        vec![(id.clone(), 1)],
        "one IncreaseSize of +1\n{}",
        ca.timeline()
    );
    assert!(ca.calls(Rpc::NodeGroupIncreaseSize)[0].is_ok(), "{up}");
    // The down worker still counts in CKS's size (CloudStack cannot go below 1 and keeps the
    // stopped VM), so the provider reports 1 → 2, not 0 → 1.
    assert_eq!(ca.last_target(&id), Some(2), "{up}");
    assert!(
        up.decisions.contains(&Decision::ScaleUp {
            group: id.clone(),
            delta: 1,
            pending: 1,
            upcoming: 0
        }),
        "{up}"
    );

    loop_until(&mut ca, "the pods to run on the new worker", |ca| {
        ca.pending_pods().is_empty()
    })
    .await;
    stack.wait_settled().await;
    let placed: Vec<(String, Vec<String>)> = ca
        .timeline()
        .observations()
        .into_iter()
        .filter_map(|(_, o)| match o {
            Observation::PodsScheduled { node, pods } => Some((node.clone(), pods.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(placed.len(), 1, "{placed:?}");
    assert_ne!(placed[0].0, down_node);
    assert_eq!(placed[0].1, ["web-1", "web-2", "web-3"]);
    let last = ca.run_once().await;
    assert_eq!((last.ready, last.not_ready), (1, 1), "{last}");
    assert_eq!(last.target(&id), Some(2), "{last}");
    // A Ready node exists again: the template comes from it, not from the provider.
    assert_eq!(last.count(Rpc::NodeGroupTemplateNodeInfo), 0, "{last}");
    assert!(matches!(
        templates(&ca, &id).pop(),
        Some(Ok(NodeTemplate {
            source: TemplateSource::ReadyNode(_),
            ..
        }))
    ));

    show("scale from zero: every worker down", &ca);
    assert!(ca.errors().is_empty(), "failed calls:\n{}", ca.timeline());
    assert_eq!(increases(&ca).len(), 1);
    let reqs = stack.scale_requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert_eq!(scale_keys(&reqs[0]), ["id", "size"]);
    assert_eq!(reqs[0]["size"], "2");
    assert_eq!(stack.cluster_size(), 2);
    let states: Vec<VmState> = stack.workers().into_iter().map(|(_, _, s)| s).collect();
    assert!(
        states.contains(&VmState::Stopped) && states.contains(&VmState::Running),
        "{states:?}"
    );
    stack.shutdown().await;
}

/// (b) A pod asking more memory than the worker offering has fits no new worker: no
/// IncreaseSize, and the timeline says why.
#[tokio::test(start_paused = true)]
async fn a_pod_bigger_than_the_worker_offering_scales_nothing() {
    let stack = zero_stack(VmState::Running, Arc::new(ProviderExtras::default())).await;
    stop_the_worker(&stack).await;
    let id = stack.cluster_id.clone();
    let mut ca = stack.autoscaler(config()).await;
    ca.set_pending_pods(vec![PodSpec::new("big", 1000, 8 * GI)]);

    loop_for(&mut ca, Duration::from_millis(500), 5).await;

    show("scale from zero: a pod too big", &ca);
    for l in ca.timeline().loops() {
        assert!(l.aborted.is_none(), "{l}");
        assert_eq!(l.count(Rpc::NodeGroupTemplateNodeInfo), 1, "{l}");
        assert_eq!(l.count(Rpc::NodeGroupIncreaseSize), 0, "{l}");
    }
    let reasons: Vec<String> = ca
        .timeline()
        .decisions()
        .into_iter()
        .filter_map(|(_, d)| match d {
            Decision::PodDoesNotFit { pod, group, reason } if pod == "big" && *group == id => {
                Some(reason.clone())
            }
            _ => None,
        })
        .collect();
    assert!(!reasons.is_empty(), "{}", ca.timeline());
    assert!(
        reasons[0].contains("memory 8Gi > allocatable 6044Mi"),
        "{}",
        reasons[0]
    );
    let line = ca.last_loop().expect("a loop").to_string();
    assert!(
        line.contains("pod big does not fit") && line.contains("no pending pod fits"),
        "{line}"
    );
    assert_eq!(ca.pending_pods().len(), 1);
    assert!(stack.scale_requests().is_empty());
    assert_eq!(stack.cluster_size(), 1);
    stack.shutdown().await;
}

/// (c) A provider without templates (NodeGroupTemplateNodeInfo Unimplemented) and a group
/// with no node at all (its only worker was down before the autoscaler's first look, so no
/// node of it is in Kubernetes): the group has no template, is no scale-up candidate, and the
/// loops go on to the end.
#[tokio::test(start_paused = true)]
async fn without_templates_a_group_without_nodes_cannot_scale_from_zero() {
    let stack = zero_stack(
        VmState::Stopped,
        Arc::new(ProviderExtras::without_template()),
    )
    .await;
    let id = stack.cluster_id.clone();
    assert!(
        stack.sim.nodes().iter().all(|n| n.role != "worker"),
        "the down worker never registered a node"
    );
    let mut ca = stack.autoscaler(config()).await;
    ca.set_pending_pods(PodSpec::replicas("web", 2, 500, GI));

    loop_for(&mut ca, Duration::from_millis(500), 5).await;

    show("scale from zero: no templates", &ca);
    for l in ca.timeline().loops() {
        assert!(l.aborted.is_none(), "{l}");
        assert_eq!(l.count(Rpc::NodeGroupIncreaseSize), 0, "{l}");
        // Unimplemented is never cached: asked every loop.
        assert_eq!(l.count(Rpc::NodeGroupTemplateNodeInfo), 1, "{l}");
        // The loop did not stop at the template pass: the cluster state, the scale-up
        // orchestrator and the scale-down pre-filter each read the target size.
        assert_eq!(l.count(Rpc::NodeGroupTargetSize), 3, "{l}");
        let reason = l
            .decisions
            .iter()
            .find_map(|d| match d {
                Decision::NoScaleUp { reason } => Some(reason.as_str()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no NoScaleUp: {l}"));
        assert!(
            reason.contains(&format!("{id} has no node template"))
                && reason.contains("Unimplemented"),
            "{reason}"
        );
    }
    for call in ca.calls(Rpc::NodeGroupTemplateNodeInfo) {
        assert_eq!(
            call.error().map(|e| e.code),
            Some(tonic::Code::Unimplemented),
            "{call}"
        );
    }
    assert!(
        templates(&ca, &id)
            .iter()
            .all(|t| t.as_ref().is_err_and(|e| e.contains("no Ready node"))),
        "{}",
        ca.timeline()
    );
    assert_eq!(ca.pending_pods().len(), 2);
    assert!(stack.scale_requests().is_empty());
    stack.shutdown().await;
}

/// (c, continued) Without templates the real autoscaler still has a last resort: a NotReady
/// node of the group. A stopped worker's node stays in Kubernetes, NotReady, so the group
/// scales from its copy (the simulator's kubelet reports the same allocatable).
#[tokio::test(start_paused = true)]
async fn without_templates_a_not_ready_node_is_the_last_resort_template() {
    let stack = zero_stack(
        VmState::Running,
        Arc::new(ProviderExtras::without_template()),
    )
    .await;
    let down_node = stop_the_worker(&stack).await;
    let id = stack.cluster_id.clone();
    let mut ca = stack.autoscaler(config()).await;
    ca.set_pending_pods(PodSpec::replicas("web", 2, 1000, GI));

    let up = ca.run_once().await;

    show("scale from zero: NotReady node as template", &ca);
    assert_eq!(up.count(Rpc::NodeGroupTemplateNodeInfo), 1, "{up}");
    assert_eq!(
        ca.calls(Rpc::NodeGroupTemplateNodeInfo)[0]
            .error()
            .map(|e| e.code),
        Some(tonic::Code::Unimplemented)
    );
    let template = templates(&ca, &id)
        .pop()
        .expect("observed")
        .expect("template");
    assert_eq!(template.source, TemplateSource::UnreadyNode(down_node));
    assert_eq!(template.allocatable, offering_allocatable());
    assert_eq!(increases(&ca), vec![(id.clone(), 1)], "{up}");
    assert_eq!(ca.last_target(&id), Some(2), "{up}");
    stack.shutdown().await;
}

/// (d) The only worker is Stopped and its node never registered (a kubelet that never joined,
/// or a Node object deleted by hand), group min 1. The provider must report the VM as an
/// instance expected to register: upstream's `expectedToRegister` (clusterstate.go) skips an
/// instance carrying an error, and such an instance is neither registered nor unregistered,
/// the group has no readiness and its target counts as an upcoming node for ever (nothing
/// scales, nothing is removed). Reported without error, it is unregistered: once it is long
/// unregistered (`--max-node-provision-time`) it no longer counts as upcoming, the pending pod
/// scales the group up from the provider's template, and once the target is above the minimum
/// the stopped VM is deleted with its fake node (CloudStack removes a down VM without a drain).
#[tokio::test(start_paused = true)]
async fn a_stopped_worker_that_never_registered_is_replaced_then_removed() {
    let mut stack = Stack::start_with_extras(
        zero_cluster(VmState::Stopped),
        "zero",
        |s| {
            s.groups[0].min = 1;
            s.groups[0].max = 3;
        },
        Arc::new(ProviderExtras::default()),
    )
    .await;
    let id = stack.cluster_id.clone();
    let (stopped, _, _) = stack.workers()[0].clone();
    assert!(
        stack.sim.nodes().iter().all(|n| n.role != "worker"),
        "the down worker never registered a node"
    );
    stack.refresh().await.expect("first Refresh");
    let mut ca = stack.autoscaler(config()).await;
    ca.set_pending_pods(PodSpec::replicas("web", 1, 1000, GI));

    let first = ca.run_once().await;
    assert!(first.aborted.is_none(), "{first}");
    assert_eq!(
        (first.groups[0].target, first.groups[0].unregistered),
        (1, 1),
        "the stopped VM is an unregistered instance\n{}",
        ca.timeline()
    );
    loop_until(
        &mut ca,
        "the pod placed and the stopped worker deleted",
        |ca| ca.pending_pods().is_empty() && !ca.calls(Rpc::NodeGroupDeleteNodes).is_empty(),
    )
    .await;
    stack.wait_settled().await;

    show(
        "scale from zero: a stopped worker that never registered",
        &ca,
    );
    assert_eq!(increases(&ca), vec![(id.clone(), 1)], "{}", ca.timeline());
    let deletes = ca.calls(Rpc::NodeGroupDeleteNodes);
    assert_eq!(deletes.len(), 1, "{}", ca.timeline());
    assert!(deletes[0].is_ok(), "{}", deletes[0]);
    let sent = deleted_nodes(deletes[0]);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].provider_id,
        format!("external-cloudstack://{stopped}")
    );
    assert_eq!(fake_reason(&sent[0]), Some(FAKE_NODE_UNREGISTERED));
    let reqs = stack.scale_requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    assert_eq!(reqs[0]["size"], "2");
    assert_eq!(reqs[1]["nodeids"], stopped, "{reqs:?}");
    assert_eq!(stack.cluster_size(), 1);
    let states: Vec<VmState> = stack.workers().into_iter().map(|(_, _, s)| s).collect();
    assert_eq!(states, [VmState::Running]);
    stack.shutdown().await;
}
