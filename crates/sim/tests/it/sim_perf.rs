//! Large clusters: listing a 5,000-VM cluster is correct here; its speed is measured by the
//! ignored test below (`cargo test --release --test sim_perf -- --ignored --nocapture`), whose
//! numbers docs/simulator.md records. Timing is not asserted: this machine's load varies.

use std::time::Instant;

use cks_sim::{ClusterSpec, Scenario, SimConfig};
use cks_testkit::cs::*;
use cks_testkit::{sim_config_with, start_sim};

fn big() -> SimConfig {
    sim_config_with(|c| {
        let mut spec = ClusterSpec::new("big", 3, 4997);
        spec.max_size = Some(5000);
        c.scenario = Scenario::with_cluster(spec);
        c.settings.max_cluster_size = 10_000;
    })
}

#[tokio::test(start_paused = true)]
async fn a_5000_vm_cluster_lists_completely() {
    let sim = start_sim(big()).await;
    let c = Client::new(&sim);
    let list = c.ok("listKubernetesClusters", &[]).await;
    let cl = &list["kubernetescluster"][0];
    assert_eq!(cl["size"], 4997);
    assert_eq!(cl["virtualmachines"].as_array().unwrap().len(), 5000);
    let names: std::collections::HashSet<_> = cl["virtualmachines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 5000, "VM names are unique");
    assert_eq!(sim.nodes().len(), 5000);
}

// A measurement of wall time: real time, not the test's clock.
#[tokio::test]
#[ignore = "measurement, run by hand in release mode"]
async fn measure_listing_a_5000_vm_cluster() {
    let sim = start_sim(big()).await;
    let c = Client::new(&sim);
    let id = sim.cluster_ids()[0].clone();
    for (label, command) in [
        ("listKubernetesClusters", "listKubernetesClusters"),
        ("listVirtualMachines", "listVirtualMachines"),
    ] {
        let mut times = Vec::new();
        for _ in 0..50 {
            let t = Instant::now();
            // pagesize=-1: the whole list (without it, default.page.size items).
            let a = c.get(command, &[("pagesize", "-1")]).await;
            times.push(t.elapsed());
            assert_eq!(a.status, 200);
        }
        times.sort();
        println!(
            "{label} (5,000 VMs, {} bytes): median {:?}, p90 {:?}, min {:?} (HTTP round trip included)",
            c.get(command, &[("pagesize", "-1")]).await.text.len(),
            times[times.len() / 2],
            times[times.len() * 9 / 10],
            times[0]
        );
    }
    let t = Instant::now();
    for _ in 0..50 {
        std::hint::black_box(sim.cluster_json(&id));
    }
    println!("in-process cluster_json: {:?} per call", t.elapsed() / 50);
}
