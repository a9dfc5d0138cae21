//! Scaling a cluster in Alert: each of the seven rules, accepted and refused, and the older
//! CloudStack (`--alert-scaling=off`) that refuses everything in Alert.

use std::time::Duration;

use cks_sim::{ClusterSpec, ClusterState, NodesSpec, Scenario, SimConfig, VmState};
use cks_testkit::cs::*;
use cks_testkit::{sim_config_with, start_sim};
use serde_json::Value;

/// Cluster "alpha": control nodes, etcd, workers and external nodes as given; autoscaling 1..10.
fn alpha(
    control: Vec<VmState>,
    etcd: Vec<VmState>,
    workers: Vec<VmState>,
    external: Vec<VmState>,
    alert_scaling: bool,
) -> SimConfig {
    let mut spec = ClusterSpec::new("alpha", 1, 0);
    spec.control = NodesSpec::States(control);
    spec.etcd = NodesSpec::States(etcd);
    spec.workers = NodesSpec::States(workers);
    spec.external = NodesSpec::States(external);
    spec.offering = Some("cks-medium".into());
    spec.autoscaling = true;
    spec.min_size = Some(1);
    spec.max_size = Some(10);
    spec.state = Some(ClusterState::Alert);
    sim_config_with(|c| {
        c.scenario = Scenario::with_cluster(spec);
        c.settings.alert_scaling = alert_scaling;
        c.settings.scanner_interval = Duration::from_secs(600);
    })
}

use VmState::{Running as R, Stopped as S};

/// The usual Alert cluster: 1 control, workers [Running, Stopped, Running].
fn usual() -> SimConfig {
    alpha(vec![R], vec![], vec![R, S, R], vec![], true)
}

struct Fixture {
    sim: cks_sim::SimHandle,
    c: Client,
    id: String,
    cluster: Value,
}

async fn fixture(cfg: SimConfig) -> Fixture {
    let sim = start_sim(cfg).await;
    let c = Client::new(&sim);
    let id = sim.cluster_ids()[0].clone();
    let cluster = c.cluster(&id).await;
    assert_eq!(cluster["state"], "Alert");
    Fixture {
        sim,
        c,
        id,
        cluster,
    }
}

impl Fixture {
    async fn scale(&self, extra: &[(&str, &str)]) -> Value {
        let mut p = vec![("id", self.id.as_str())];
        p.extend_from_slice(extra);
        self.c.scale(&p).await
    }

    async fn refused(&self, extra: &[(&str, &str)]) -> String {
        let job = self.scale(extra).await;
        assert_eq!(job["jobresultcode"], 530, "{job}");
        let text = failure_text(&job);
        let after = self.c.cluster(&self.id).await;
        assert_eq!(after["state"], "Alert", "a refusal changes nothing");
        assert_eq!(after["size"], self.cluster["size"]);
        text
    }

    async fn accepted(&self, extra: &[(&str, &str)]) -> Value {
        let job = self.scale(extra).await;
        assert_eq!(
            job["jobstatus"], 1,
            "expected acceptance of {extra:?}: {job}"
        );
        self.c.cluster(&self.id).await
    }

    fn ids(&self, pattern: &str) -> Vec<String> {
        vm_ids(&self.cluster, pattern)
    }

    async fn offering_id(&self, name: &str) -> String {
        let list = self.c.ok("listServiceOfferings", &[("name", name)]).await;
        list["serviceoffering"][0]["id"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

#[tokio::test(start_paused = true)]
async fn size_changes_and_worker_removal_are_accepted_in_alert() {
    let f = fixture(usual()).await;
    let workers = f.ids("-node-");
    // Scale up: waits only for the nodes whose VMs are not down.
    let after = f.accepted(&[("size", "4")]).await;
    assert_eq!(after["size"], 4);
    assert_eq!(
        after["state"], "Running",
        "success moves the cluster to Running; the scanner brings Alert back"
    );
    assert_eq!(f.sim.cluster_state(&f.id), Some(ClusterState::Running));
    f.sim.scan_now();
    assert_eq!(f.sim.cluster_state(&f.id), Some(ClusterState::Alert));

    // Scale down by size: the stopped worker goes first.
    let after = f.accepted(&[("size", "3")]).await;
    assert!(
        vm_state(&after, &workers[1]).is_none(),
        "stopped worker removed: {after}"
    );
    assert_eq!(vm_ids(&after, "-node-").len(), 3);
}

#[tokio::test(start_paused = true)]
async fn removing_the_down_worker_by_nodeids_is_accepted() {
    let f = fixture(usual()).await;
    let down = f.ids("-node-")[1].clone();
    let after = f.accepted(&[("nodeids", &down)]).await;
    assert!(vm_state(&after, &down).is_none());
    assert_eq!(after["size"], 2);
    f.sim.scan_now();
    assert_eq!(
        f.sim.cluster_state(&f.id),
        Some(ClusterState::Running),
        "nothing down any more"
    );
}

#[tokio::test(start_paused = true)]
async fn rule_1_offering_change_refused_same_offering_accepted() {
    let f = fixture(usual()).await;
    let large = f.offering_id("cks-large").await;
    let text = f
        .refused(&[("serviceofferingid", &large), ("size", "4")])
        .await;
    assert_eq!(
        text,
        "Kubernetes cluster alpha is in Alert state and its service offering can not be changed; only its size can be changed or worker nodes removed"
    );
    let text = f
        .refused(&[
            ("nodeofferings[0].node", "worker"),
            ("nodeofferings[0].offering", &large),
            ("size", "4"),
        ])
        .await;
    assert!(
        text.contains("service offering can not be changed"),
        "{text}"
    );
    let medium = f.offering_id("cks-medium").await;
    f.accepted(&[("serviceofferingid", &medium), ("size", "4")])
        .await;
}

#[tokio::test(start_paused = true)]
async fn rule_1_autoscaling_change_refused_same_values_accepted() {
    let f = fixture(usual()).await;
    let expected = "Kubernetes cluster alpha is in Alert state and its autoscaling settings can not be changed; only its size can be changed or worker nodes removed";
    assert_eq!(
        f.refused(&[("autoscalingenabled", "false")]).await,
        expected
    );
    assert_eq!(
        f.refused(&[("minsize", "2"), ("size", "4")]).await,
        expected
    );
    assert_eq!(
        f.refused(&[("maxsize", "9"), ("size", "4")]).await,
        expected
    );
    f.accepted(&[("minsize", "1"), ("maxsize", "10"), ("size", "4")])
        .await;
}

#[tokio::test(start_paused = true)]
async fn rule_2_a_request_that_changes_nothing_is_refused() {
    let f = fixture(usual()).await;
    let expected = "Kubernetes cluster alpha is in Alert state and the request changes neither its size nor its nodes";
    assert_eq!(f.refused(&[("size", "3")]).await, expected);
    let medium = f.offering_id("cks-medium").await;
    assert_eq!(f.refused(&[("serviceofferingid", &medium)]).await, expected);
    f.accepted(&[("size", "2")]).await;
}

#[tokio::test(start_paused = true)]
async fn rule_3_only_worker_nodes_may_be_removed() {
    let f = fixture(alpha(vec![R, R], vec![R], vec![R, S, R], vec![R], true)).await;
    let vms = f.cluster["virtualmachines"].as_array().unwrap().clone();
    let by = |pred: &dyn Fn(&Value) -> bool| {
        vms.iter().find(|v| pred(v)).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let control = f.ids("-control-")[1].clone();
    let etcd = by(&|v| v["isetcdnode"] == true);
    let external = by(&|v| v["isexternalnode"] == true);
    let down_worker = f.ids("-node-")[1].clone();
    for (id, role) in [
        (&control, "control"),
        (&etcd, "etcd"),
        (&external, "external"),
    ] {
        let list = format!("{down_worker},{id}");
        let text = f.refused(&[("nodeids", &list)]).await;
        assert!(
            text.starts_with("Kubernetes cluster alpha is in Alert state and only worker nodes can be removed; not worker nodes: "),
            "{text}"
        );
        assert!(text.contains(&format!("{role} node, VM {id}")), "{text}");
    }
    f.accepted(&[("nodeids", &down_worker)]).await;
}

#[tokio::test(start_paused = true)]
async fn rule_4_first_control_node_must_run() {
    let f = fixture(alpha(vec![S, R], vec![], vec![R, S], vec![], true)).await;
    let first = f.ids("-control-")[0].clone();
    let text = f.refused(&[("size", "1")]).await;
    assert!(
        text.starts_with("Kubernetes cluster alpha is in Alert state and can not be scaled while its first control node VM alpha-control-"),
        "{text}"
    );
    assert!(text.ends_with(&format!("({first}) is Stopped")), "{text}");
    f.sim.start_vm(&first);
    f.accepted(&[("size", "1")]).await;
}

#[tokio::test(start_paused = true)]
async fn rule_5_as_many_vms_as_nodes() {
    let mut cfg = usual();
    cfg.scenario.clusters[0].size = Some(4);
    let f = fixture(cfg).await;
    let text = f.refused(&[("size", "2")]).await;
    assert_eq!(
        text,
        "Kubernetes cluster alpha is in Alert state and can not be scaled while it has 4 VMs for 5 nodes"
    );
}

#[tokio::test(start_paused = true)]
async fn rule_6_control_and_etcd_vms_must_be_up() {
    let f = fixture(alpha(vec![R, S], vec![R], vec![R, S], vec![], true)).await;
    let text = f.refused(&[("size", "1")]).await;
    assert!(text.starts_with("Kubernetes cluster alpha is in Alert state and can not be scaled while control or etcd node VMs are down: alpha-control-"), "{text}");
    f.sim.start_vm(&f.ids("-control-")[1]);
    f.accepted(&[("size", "1")]).await;

    let f = fixture(alpha(vec![R], vec![R, S], vec![R, S], vec![], true)).await;
    let text = f.refused(&[("size", "1")]).await;
    assert!(
        text.contains("control or etcd node VMs are down: alpha-etcd-2-"),
        "{text}"
    );
    assert!(text.contains("(Stopped)"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn rule_7_some_worker_vm_must_be_down() {
    let f = fixture(alpha(vec![R], vec![], vec![R, R], vec![], true)).await;
    let expected = "Kubernetes cluster alpha is in Alert state and can not be scaled as no worker node VM is down; scaling would not fix the cause of the Alert state";
    assert_eq!(f.refused(&[("size", "3")]).await, expected);
    // A down external node does not count.
    let f = fixture(alpha(vec![R], vec![], vec![R, R], vec![S], true)).await;
    assert_eq!(f.refused(&[("size", "4")]).await, expected);
    // Migrating and Unknown VMs are not down either.
    let f = fixture(alpha(
        vec![R],
        vec![],
        vec![R, VmState::Unknown],
        vec![],
        true,
    ))
    .await;
    assert_eq!(f.refused(&[("size", "3")]).await, expected);
    let f = fixture(alpha(
        vec![R],
        vec![],
        vec![R, VmState::Error],
        vec![],
        true,
    ))
    .await;
    f.accepted(&[("size", "3")]).await;
}

#[tokio::test(start_paused = true)]
async fn without_alert_scaling_every_request_in_alert_is_refused() {
    let f = fixture(alpha(vec![R], vec![], vec![R, S, R], vec![], false)).await;
    let expected = "Kubernetes cluster alpha is in Alert state and can not be scaled";
    let down = f.ids("-node-")[1].clone();
    assert_eq!(f.refused(&[("size", "4")]).await, expected);
    assert_eq!(f.refused(&[("size", "2")]).await, expected);
    assert_eq!(f.refused(&[("nodeids", &down)]).await, expected);

    // Switching a running simulator between the two behaviours.
    let f = fixture(usual()).await;
    let echo = f.c.sim("simConfigure", &[("alertscaling", "off")]).await;
    assert_eq!(echo["alertscaling"], "off");
    assert_eq!(f.refused(&[("size", "4")]).await, expected);
    f.c.sim("simConfigure", &[("alertscaling", "on")]).await;
    f.accepted(&[("size", "4")]).await;
}

#[tokio::test(start_paused = true)]
async fn other_states_are_refused_with_cloudstacks_text() {
    let f = fixture(usual()).await;
    f.sim.set_cluster_state(&f.id, ClusterState::Upgrading);
    let job = f.scale(&[("size", "4")]).await;
    assert_eq!(
        failure_text(&job),
        "Kubernetes cluster alpha is in Upgrading state and can not be scaled"
    );
}
