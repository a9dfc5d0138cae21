//! End-to-end scenarios under both sides of the externalgrpc wire change: mock autoscaler →
//! provider → simulated CloudStack, the mock speaking the message shapes of one release
//! (`AutoscalerConfig::release`, or `AutoscalerConfig::wire` for 1.34.2):
//!
//! | release | template read from | option durations sent and read | dereferenced unchecked |
//! |---|---|---|---|
//! | 1.28 | field 1 | 3, 4 (the provider answers it no options) | 3, 4 |
//! | 1.33 | field 1 | 3, 4, 5 | 3, 4, 5 |
//! | 1.34.2 | field 2, else 1 | sent in 3-5 and 8-10, read from 8-10 else 3-5 | 3-5 when 8-10 miss |
//! | 1.35 | field 2 | 8, 9, 10 | none |
//!
//! Each scenario runs with `--node-group-options`-style overrides, so NodeGroupGetOptions is
//! answered with options (every release but 1.28). A release that finds no template in the
//! field it reads, or no duration in fields 3-5 it dereferences, crashes: the mock reports the
//! loop aborted, so these scenarios fail when the provider stops sending template field 1 or
//! option fields 3-5 (as they fail for 1.35 without field 2 or 8-10).

use cks_autoscaler_provider::optional_rpcs::ProviderExtras;
use cks_autoscaler_provider::options::parse_overrides_spec;
use cks_lab::autoscaler::{
    AutoscalerConfig, Call, MockAutoscaler, NodeGroupOptions, OptionsAnswer, PodSpec, Reply,
    Request, Rpc, TemplateSource, WireGeneration,
};
use cks_sim::{ClusterSpec, NodesSpec, Scenario, VmState};
use cks_testkit::stack::*;
use cks_testkit::*;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

const MI: u64 = 1 << 20;

/// The releases the scenarios run under: (minor, wire override).
const V1_28: (u32, Option<WireGeneration>) = (28, None);
const V1_33: (u32, Option<WireGeneration>) = (33, None);
const V1_34_2: (u32, Option<WireGeneration>) = (34, Some(WireGeneration::V1_34_2));
const V1_35: (u32, Option<WireGeneration>) = (35, None);

/// Timers / 600 (unneeded time 1 s, unready 2 s, provision 1.5 s, delay after add 1 s), a
/// loop every 30 ms, speaking `release`.
fn config((minor, wire): (u32, Option<WireGeneration>)) -> AutoscalerConfig {
    let mut c = autoscaler_config(600, 30, WAIT);
    c.release = minor;
    c.wire = wire;
    c
}

/// A provider serving template nodes and these NodeGroupGetOptions overrides.
fn extras(overrides: &str) -> Arc<ProviderExtras> {
    let mut extras = ProviderExtras::default();
    let (cluster, o) = parse_overrides_spec(overrides).expect("override spec");
    extras.overrides.insert(cluster, o);
    Arc::new(extras)
}

/// Every loop ran to its end (no crash, no aborted loop) and no call failed.
fn assert_clean(ca: &MockAutoscaler, what: &str) {
    let aborted = ca.timeline().aborted_loops();
    assert!(
        aborted.is_empty(),
        "{what}: aborted loops {aborted:?}\n{}",
        ca.timeline()
    );
    assert!(
        ca.errors().is_empty(),
        "{what}: failed calls\n{}",
        ca.timeline()
    );
}

/// The options the mock's release made of every NodeGroupGetOptions answer (from the loops
/// and the background deletions): what its client read from the fields it reads.
fn options_read(ca: &MockAutoscaler) -> Vec<OptionsAnswer> {
    let wire = ca.config().wire_generation();
    ca.calls(Rpc::NodeGroupGetOptions)
        .into_iter()
        .map(|c: &Call| match &c.outcome {
            Ok(Reply::Options(answer)) => wire
                .read_options(answer.as_ref())
                .unwrap_or_else(|crash| panic!("{c}: {crash}")),
            other => panic!("{c}: {other:?}"),
        })
        .collect()
}

/// Asserts that the release got the overridden duration through NodeGroupGetOptions, or, for
/// 1.28 (whose client reads no provision time), no options at all: its flags apply.
fn assert_options_applied(
    ca: &MockAutoscaler,
    what: &str,
    overridden: impl Fn(&NodeGroupOptions) -> Duration,
    want: Duration,
) {
    let read = options_read(ca);
    assert!(!read.is_empty(), "{what}: no NodeGroupGetOptions call");
    for answer in read {
        match (ca.config().wire_generation(), answer) {
            (WireGeneration::V1_28, OptionsAnswer::Flags) => {}
            (WireGeneration::V1_28, other) => panic!("{what}: 1.28 got {other:?}"),
            (_, OptionsAnswer::Options(o)) => assert_eq!(overridden(&o), want, "{what}: {o:?}"),
            (_, OptionsAnswer::Flags) => panic!("{what}: no options answered"),
        }
    }
}

/// Scale from zero: the cluster's only worker is down, so a freshly started autoscaler has no
/// Ready node to copy and takes the group's template from NodeGroupTemplateNodeInfo, in the
/// field its release reads; the pending pods fit it, the group grows by one, the new worker
/// takes the pods.
async fn scale_from_zero(release: (u32, Option<WireGeneration>)) {
    let mut spec = ClusterSpec::new("zero", 1, 1);
    spec.offering = Some("cks-medium".into());
    spec.workers = NodesSpec::States(vec![VmState::Running]);
    let mut sim = sim_config();
    sim.scenario = Scenario::with_cluster(spec);
    let stack = Stack::start_with_extras(
        sim,
        "zero",
        |s| {
            s.groups[0].min = 0;
            s.groups[0].max = 3;
        },
        extras("zero:max-node-provision=3s"),
    )
    .await;
    let id = stack.cluster_id.clone();
    let (worker, _, _) = stack.workers()[0].clone();
    assert!(stack.sim.stop_vm(&worker));
    stack.wait_state("Alert").await;
    wait_until("the stopped worker's node to be NotReady", async || {
        stack.sim.nodes().iter().any(|n| !n.ready)
    })
    .await;

    let mut cfg = config(release);
    // The down worker stays while the scenario runs.
    cfg.scale_down_unready_time = Duration::from_secs(60);
    let mut ca = stack.autoscaler(cfg).await;
    let what = format!("scale from zero under {}", ca.config().wire_generation());
    let first = ca.run_once().await;
    assert!(first.aborted.is_none(), "{what}: {first}");
    assert_eq!((first.ready, first.not_ready), (0, 1), "{what}: {first}");
    assert_eq!(
        first.count(Rpc::NodeGroupTemplateNodeInfo),
        1,
        "{what}: {first}"
    );
    let template = ca
        .timeline()
        .templates(&id)
        .pop()
        .map(|(_, t)| t.clone())
        .expect("a template observed")
        .unwrap_or_else(|e| panic!("{what}: no template: {e}"));
    assert_eq!(template.source, TemplateSource::Provider, "{what}");

    // Two pods of 0.75 cpu / 1.5Gi: one cks-medium worker (2 vCPU, 4 GiB) holds both.
    ca.set_pending_pods(PodSpec::replicas("web", 2, 750, 1536 * MI));
    loop_until(&mut ca, "the pods to run on a new worker", |ca| {
        ca.pending_pods().is_empty()
    })
    .await;
    stack.wait_settled().await;
    let increases: Vec<Request> = ok_calls(&ca, Rpc::NodeGroupIncreaseSize)
        .into_iter()
        .map(|c| c.request)
        .collect();
    assert_eq!(
        increases,
        [Request::NodeGroupIncreaseSize {
            id: id.clone(),
            delta: 1
        }],
        "{what}"
    );
    let last = ca.run_once().await;
    assert_eq!(
        (last.ready, last.target(&id)),
        (1, Some(2)),
        "{what}: {last}"
    );
    assert_eq!(stack.cluster_size(), 2, "{what}");
    assert_clean(&ca, &what);
    assert_options_applied(
        &ca,
        &what,
        |o| o.max_node_provision_time,
        Duration::from_secs(3),
    );
    stack.shutdown().await;
}

/// Scale-up then per-node scale-down: demand for two more nodes on the 3-worker demo
/// cluster, then a workload needing two: the autoscaler removes three nodes, one
/// NodeGroupDeleteNodes per node (a node still there after the max deletion time is asked
/// for again), after the unneeded time NodeGroupGetOptions gives it.
async fn scale_up_then_down(release: (u32, Option<WireGeneration>)) {
    let stack = Stack::start_with_extras(
        sim_config(),
        "demo",
        |_| {},
        extras("demo:scale-down-unneeded=500ms"),
    )
    .await;
    let id = stack.cluster_id.clone();
    let mut ca = stack.autoscaler(config(release)).await;
    let what = format!("scale up and down under {}", ca.config().wire_generation());
    ca.set_demand(2);
    loop_until(&mut ca, "5 Ready nodes", |ca| {
        ca.last_loop().is_some_and(|l| l.ready == 5)
    })
    .await;
    stack.wait_settled().await;
    assert_eq!(stack.cluster_size(), 5, "{what}");
    assert_eq!(ok_calls(&ca, Rpc::NodeGroupIncreaseSize).len(), 1, "{what}");

    ca.set_needed_nodes(2);
    loop_until(&mut ca, "the cluster down to 2 workers", |ca| {
        stack.sim.scan_now();
        stack.cluster_size() == 2
            && stack.sim.running_jobs(&id) == 0
            && ca.last_loop().is_some_and(|l| l.ready == 2)
    })
    .await;
    ca.settle_deletions().await;
    let mut removed = BTreeSet::new();
    for c in ca.calls(Rpc::NodeGroupDeleteNodes) {
        assert!(c.is_ok(), "{what}: {c}");
        let nodes = deleted_nodes(c);
        assert_eq!(nodes.len(), 1, "one node per call: {c}");
        removed.insert(nodes[0].name.clone());
    }
    assert_eq!(removed.len(), 3, "{what}: {removed:?}\n{}", ca.timeline());
    assert_eq!(stack.workers().len(), 2, "{what}");
    let last = ca.run_once().await;
    assert_eq!(last.target(&id), Some(2), "{what}: {last}");
    assert_clean(&ca, &what);
    assert_options_applied(
        &ca,
        &what,
        |o| o.scale_down_unneeded_time,
        Duration::from_millis(500),
    );
    stack.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn release_1_28_scales_from_zero() {
    scale_from_zero(V1_28).await;
}

#[tokio::test(start_paused = true)]
async fn release_1_33_scales_from_zero_with_template_field_1() {
    scale_from_zero(V1_33).await;
}

#[tokio::test(start_paused = true)]
async fn release_1_34_2_scales_from_zero() {
    scale_from_zero(V1_34_2).await;
}

#[tokio::test(start_paused = true)]
async fn release_1_35_scales_from_zero_with_template_field_2() {
    scale_from_zero(V1_35).await;
}

#[tokio::test(start_paused = true)]
async fn release_1_28_scales_up_and_down_with_its_flags() {
    scale_up_then_down(V1_28).await;
}

#[tokio::test(start_paused = true)]
async fn release_1_33_scales_up_and_down_with_options_in_fields_3_to_5() {
    scale_up_then_down(V1_33).await;
}

#[tokio::test(start_paused = true)]
async fn release_1_34_2_scales_up_and_down_with_options_in_both_sets() {
    scale_up_then_down(V1_34_2).await;
}

#[tokio::test(start_paused = true)]
async fn release_1_35_scales_up_and_down_with_options_in_fields_8_to_10() {
    scale_up_then_down(V1_35).await;
}
