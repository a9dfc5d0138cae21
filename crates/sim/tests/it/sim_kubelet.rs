//! Kubelet emulation: when nodes register and are Ready, what they look like, and the
//! `simListNodes` contract the mock autoscaler reads.

use std::time::Duration;

use cks_sim::SimNode;
use cks_testkit::cs::*;
use cks_testkit::{sim_config, sim_config_with, start_sim, wait_until};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[tokio::test(start_paused = true)]
async fn sim_list_nodes_reports_registered_nodes_with_ccm_metadata() {
    let sim = start_sim(sim_config()).await;
    let c = Client::new(&sim);
    let id = sim.cluster_ids()[0].clone();
    let list = c.sim("simListNodes", &[("clusterid", &id)]).await;
    assert_eq!(list["count"], 4);
    let nodes: Vec<SimNode> = serde_json::from_value(list["node"].clone()).unwrap();
    let cl = c.cluster(&id).await;
    for (node, vm) in nodes.iter().zip(cl["virtualmachines"].as_array().unwrap()) {
        let vm_id = vm["id"].as_str().unwrap();
        assert_eq!(node.vmid, vm_id);
        assert_eq!(node.providerid, format!("external-cloudstack://{vm_id}"));
        assert_eq!(node.name, vm["name"].as_str().unwrap().to_lowercase());
        assert_eq!(node.clusterid, id);
        assert!(node.ready);
        assert_eq!(node.labels["kubernetes.io/hostname"], node.name);
        assert_eq!(
            node.labels["node.kubernetes.io/instance-type"],
            "cks-medium"
        );
        assert_eq!(node.labels["topology.kubernetes.io/zone"], "zone1");
        // A default kubelet on cks-medium (2 vCPU, 4096 MB): every core, the memory less the
        // 100Mi hard eviction threshold, 110 pods.
        let alloc: Vec<(&str, &str)> = node
            .allocatable
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(alloc, [("cpu", "2"), ("memory", "3996Mi"), ("pods", "110")]);
    }
    assert_eq!(nodes[0].role, "control");
    assert!(
        nodes[0]
            .labels
            .contains_key("node-role.kubernetes.io/control-plane")
    );
    assert!(nodes[1..].iter().all(|n| {
        n.role == "worker"
            && !n
                .labels
                .contains_key("node-role.kubernetes.io/control-plane")
    }));
    assert_eq!(sim.nodes(), nodes);
    // Unknown cluster ids are a parameter error.
    let a = c
        .raw(&format!(
            "{}?command=simListNodes&clusterid=00000000-0000-4000-8000-000000000000",
            sim.api_url
        ))
        .await
        .unwrap();
    assert_eq!(a.status, 431);
}

#[tokio::test(start_paused = true)]
async fn a_new_vms_node_registers_the_kubelet_delay_after_the_vm_runs() {
    let sim = start_sim(sim_config_with(|c| {
        c.settings.kubelet_delay = ms(300);
        c.settings.job_duration = ms(40);
        c.settings.scanner_interval = ms(60_000);
    }))
    .await;
    let c = Client::new(&sim);
    let id = sim.cluster_ids()[0].clone();
    let submitted_at = sim.now_ms();
    let job = c
        .submit("scaleKubernetesCluster", &[("id", &id), ("size", "4")])
        .await;
    let new_vm = sim.vms(&id)[4].0.clone();
    // Running after half the job; not registered until the delay has passed.
    wait_until("new VM running", async || {
        sim.vms(&id)[4].2 == cks_sim::VmState::Running
    })
    .await;
    wait_until("node registered", async || {
        sim.nodes().iter().any(|n| n.vmid == new_vm)
    })
    .await;
    let node = sim.nodes().into_iter().find(|n| n.vmid == new_vm).unwrap();
    assert!(node.ready);
    assert!(
        node.registeredms >= submitted_at + 300,
        "registered at {} for a VM created at {submitted_at}",
        node.registeredms
    );
    // The job waited for that node to be Ready.
    let done = c.wait_job(&job).await;
    assert_eq!(done["jobstatus"], 1, "{done}");
}

#[tokio::test(start_paused = true)]
async fn a_down_vms_node_stays_not_ready_and_a_removed_vms_node_goes() {
    let sim = start_sim(sim_config_with(|c| {
        c.settings.kubelet_delay = ms(100);
        c.settings.scanner_interval = ms(60_000);
    }))
    .await;
    let c = Client::new(&sim);
    let id = sim.cluster_ids()[0].clone();
    let workers = vm_ids(&c.cluster(&id).await, "-node-");
    let node = |vm: &str| sim.nodes().into_iter().find(|n| n.vmid == vm);

    let job = c.submit("stopVirtualMachine", &[("id", &workers[0])]).await;
    c.wait_job(&job).await;
    let n = node(&workers[0]).expect("a down VM's node stays registered");
    assert!(!n.ready);
    let job = c
        .submit("startVirtualMachine", &[("id", &workers[0])])
        .await;
    c.wait_job(&job).await;
    wait_until("node Ready again", async || {
        node(&workers[0]).is_some_and(|n| n.ready)
    })
    .await;

    let done = c.scale(&[("id", &id), ("nodeids", &workers[1])]).await;
    assert_eq!(done["jobstatus"], 1, "{done}");
    assert!(node(&workers[1]).is_none());
    assert_eq!(c.sim("simListNodes", &[]).await["count"], 3);
}

#[tokio::test(start_paused = true)]
async fn a_vm_stopped_before_registering_never_registers() {
    let sim = start_sim(sim_config_with(|c| {
        c.settings.kubelet_delay = ms(200);
        c.settings.job_duration = ms(20);
        c.settings.scale_timeout = ms(600);
        c.settings.scanner_interval = ms(60_000);
    }))
    .await;
    let c = Client::new(&sim);
    let id = sim.cluster_ids()[0].clone();
    let job = c
        .submit("scaleKubernetesCluster", &[("id", &id), ("size", "4")])
        .await;
    let new_vm = sim.vms(&id)[4].0.clone();
    wait_until("new VM running", async || {
        sim.vms(&id)[4].2 == cks_sim::VmState::Running
    })
    .await;
    sim.stop_vm(&new_vm);
    let done = c.wait_job(&job).await;
    assert!(failure_text(&done).contains("does not have desired number of nodes in ready state"));
    assert!(sim.nodes().iter().all(|n| n.vmid != new_vm));
}

/// Nodes that joined before the simulator started are Ready at once, not a kubelet delay
/// later: a test (or a fast machine) acting at start sees a healthy cluster.
#[tokio::test(start_paused = true)]
async fn nodes_of_a_running_cluster_are_ready_from_the_start() {
    let sim = start_sim(sim_config_with(|c| {
        c.settings.kubelet_delay = Duration::from_secs(60)
    }))
    .await;
    let nodes = sim.nodes();
    assert_eq!(nodes.len(), 4);
    assert!(nodes.iter().all(|n| n.ready), "{nodes:?}");
}
