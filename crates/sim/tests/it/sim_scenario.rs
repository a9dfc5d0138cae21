//! Scenario files, deterministic ids, and the `cks-sim` binary on its own.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use cks_sim::{Scenario, SimConfig};
use cks_testkit::cs::*;
use cks_testkit::{API_KEY, SECRET_KEY, sim_config_with, start_sim};

const YAML: &str = r#"
zone: { name: lab-zone }
hypervisor: KVM
offerings:
  - { name: k8s-2c4g, cpu: 2, memory: 4096 }
  - { name: k8s-4c8g, cpu: 4, memory: 8192 }
clusters:
  - name: web
    offering: k8s-2c4g
    worker_offering: k8s-4c8g
    control: 3
    etcd: 1
    workers: [Running, Stopped, Running]
    min_size: 1
    max_size: 6
    autoscaling: true
  - name: batch
    workers: 2
"#;

const TOML: &str = r#"
[zone]
name = "lab-zone"

[[offerings]]
name = "k8s-2c4g"
cpu = 2
memory = 4096

[[offerings]]
name = "k8s-4c8g"
cpu = 4
memory = 8192

[[clusters]]
name = "web"
offering = "k8s-2c4g"
worker_offering = "k8s-4c8g"
control = 3
etcd = 1
workers = ["Running", "Stopped", "Running"]
min_size = 1
max_size = 6
autoscaling = true

[[clusters]]
name = "batch"
workers = 2
"#;

fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
    cks_testkit::temp_file("sim", name, text)
}

#[tokio::test(start_paused = true)]
async fn yaml_and_toml_files_load_the_same_layout() {
    let yaml = Scenario::load(&temp_file("s.yaml", YAML)).unwrap();
    let toml = Scenario::load(&temp_file("s.toml", TOML)).unwrap();
    assert_eq!(yaml, toml);
    let sim = start_sim(sim_config_with(|c| c.scenario = yaml)).await;
    let c = Client::new(&sim);
    let list = c.ok("listKubernetesClusters", &[]).await;
    assert_eq!(list["count"], 2);
    let web = &list["kubernetescluster"][0];
    assert_eq!(web["name"], "web");
    assert_eq!(
        web["state"], "Alert",
        "a stopped worker at start means Alert"
    );
    assert_eq!(
        (
            web["controlnodes"].as_u64(),
            web["etcdnodes"].as_u64(),
            web["size"].as_u64()
        ),
        (Some(3), Some(1), Some(3))
    );
    assert_eq!(web["zonename"], "lab-zone");
    assert_eq!(web["workerofferingname"], "k8s-4c8g");
    assert_eq!(web["cpunumber"], (3 * 2 + 2 + 3 * 4).to_string());
    let states: Vec<_> = web["virtualmachines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["state"].as_str().unwrap())
        .collect();
    assert_eq!(
        states,
        [
            "Running", "Running", "Running", "Running", "Running", "Stopped", "Running"
        ]
    );
    assert_eq!(list["kubernetescluster"][1]["state"], "Running");
    // The stopped worker's node is not registered.
    assert_eq!(
        c.sim(
            "simListNodes",
            &[("clusterid", web["id"].as_str().unwrap())]
        )
        .await["count"],
        5
    );
}

#[tokio::test(start_paused = true)]
async fn bad_scenario_files_say_what_is_wrong() {
    let e = Scenario::load(&temp_file(
        "bad.yaml",
        "clusters:\n  - name: x\n    workers: lots\n",
    ))
    .unwrap_err();
    assert!(format!("{e:#}").contains("bad.yaml"), "{e:#}");
    let e = Scenario::load(&temp_file("s.json", "{}")).unwrap_err();
    assert!(e.to_string().contains(".yaml, .yml or .toml"), "{e}");
    let e = Scenario::load(&temp_file(
        "dup.toml",
        "[[clusters]]\nname='a'\n[[clusters]]\nname='a'\n",
    ))
    .unwrap_err();
    assert!(format!("{e:#}").contains("used twice"), "{e:#}");
}

#[tokio::test(start_paused = true)]
async fn the_same_seed_gives_the_same_ids() {
    let ids = |seed: u64| async move {
        let sim = start_sim(SimConfig {
            seed,
            ..SimConfig::for_tests(API_KEY, SECRET_KEY)
        })
        .await;
        let id = sim.cluster_ids()[0].clone();
        (id.clone(), sim.vms(&id))
    };
    let (a, b, other) = (ids(7).await, ids(7).await, ids(8).await);
    assert_eq!(a, b);
    assert_ne!(a.0, other.0);
}

#[test]
fn help_documents_every_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_cks-sim"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--listen",
        "--api-key",
        "--secret-key",
        "--scenario",
        "--seed",
        "--alert-scaling",
        "--cloudstack-version",
        "--job-duration-ms",
        "--kubelet-delay-ms",
        "--scanner-interval-ms",
        "--vm-op-ms",
        "--ready-poll-ms",
        "--scale-timeout-ms",
        "--max-cluster-size",
        "--latency-ms",
        "--error-rate",
        "--drop-rate",
        "--malformed-rate",
        "--job-failure",
        "--fail-drains",
        "--key-role",
        "--default-page-size",
    ] {
        assert!(help.contains(flag), "{flag} not in --help:\n{help}");
    }
}

#[test]
fn the_binary_rejects_a_bad_scenario_and_bad_flags() {
    let bad = temp_file(
        "broken.toml",
        "[[clusters]]\nname = 'a'\noffering = 'missing'\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_cks-sim"))
        .arg("--scenario")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("missing") && err.contains("broken.toml"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_cks-sim"))
        .args(["--alert-scaling", "maybe"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let out = Command::new(env!("CARGO_BIN_EXE_cks-sim"))
        .args(["--error-rate", "3"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[tokio::test(start_paused = true)]
async fn the_binary_serves_a_scenario_with_the_given_keys() {
    let path = temp_file("bin.yaml", YAML);
    let mut child = Command::new(env!("CARGO_BIN_EXE_cks-sim"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--api-key",
            "bin-key",
            "--secret-key",
            "bin-secret",
            "--alert-scaling",
            "off",
        ])
        .arg("--scenario")
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    // Kept open while the simulator runs.
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    stdout.read_line(&mut first).unwrap();
    let url = first.trim().rsplit(' ').next().unwrap().to_string();
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/client/api"),
        "{first}"
    );
    let c = Client {
        http: reqwest::Client::new(),
        url: url.clone(),
        key: "bin-key".into(),
        secret: "bin-secret".into(),
    };
    let list = c.ok("listKubernetesClusters", &[("name", "web")]).await;
    let id = list["kubernetescluster"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let text = failure_text(&c.scale(&[("id", &id), ("size", "2")]).await);
    assert_eq!(
        text,
        "Kubernetes cluster web is in Alert state and can not be scaled"
    );
    child.kill().unwrap();
    let _ = child.wait();
    drop(stdout);
}
