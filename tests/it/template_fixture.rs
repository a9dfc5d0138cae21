//! The template encoder against bytes produced independently.
//!
//! Each case under `tests/fixtures/template/` is a JSON file holding the inputs of
//! `build_template_node` and, written out by hand, the Node a new worker should be; the `.bin`
//! beside it is that Node encoded by Python's protobuf library from a `.proto` subset with
//! Kubernetes' upstream field numbers (`tools/template-fixture/make_fixture.py`, run at
//! development time only). A test builds the same Node from the same inputs and checks:
//! - the fixture decoded with k8s-pb equals the Node we build (field numbers, types, label and
//!   quantity values all agree with an independent encoder and a hand-written expectation);
//! - our bytes decoded with k8s-pb equal the fixture decoded;
//! - the raw bytes are identical where both encoders write the same fields. They are not when a
//!   map entry has an empty value: Python (like Go's generated code) writes the empty value,
//!   prost leaves it out. Go's `Unmarshal` reads both the same way. The JSON says which.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cks_autoscaler_provider::template::{
    GpuSpec, Reserved, TemplateInput, TemplateSettings, build_template_node, encode_node,
    parse_taint,
};
use k8s_pb::api::core::v1::Node;
use prost::Message;
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    description: String,
    byte_identical: bool,
    input: InputJson,
    settings: SettingsJson,
}

#[derive(Deserialize)]
struct InputJson {
    group_id: String,
    cluster_name: String,
    offering_name: String,
    cpus: u64,
    memory_mib: u64,
    root_disk_gib: Option<u64>,
    zone_name: String,
    arch: String,
    copied_labels: BTreeMap<String, String>,
    gpu: Option<GpuJson>,
}

#[derive(Deserialize)]
struct GpuJson {
    resource_name: String,
    count: u64,
    gpu_type: String,
}

#[derive(Deserialize, Clone)]
struct ReservedJson {
    cpu_millis: u64,
    memory_mib: u64,
    ephemeral_gib: u64,
}

#[derive(Deserialize)]
struct SettingsJson {
    pods: u64,
    system_reserved: ReservedJson,
    kube_reserved: ReservedJson,
    eviction_hard_memory_mib: u64,
    eviction_hard_nodefs_percent: u8,
    default_root_disk_gib: u64,
    extra_labels: BTreeMap<String, String>,
    extra_taints: Vec<String>,
    gpu_label: Option<String>,
}

impl From<ReservedJson> for Reserved {
    fn from(r: ReservedJson) -> Self {
        Reserved {
            cpu_millis: r.cpu_millis,
            memory_mib: r.memory_mib,
            ephemeral_gib: r.ephemeral_gib,
        }
    }
}

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/template")
}

/// Builds our Node for a case and returns it with the fixture's bytes.
fn load(case_name: &str) -> (Case, Node, Vec<u8>) {
    let dir = fixture_dir();
    let json = std::fs::read_to_string(dir.join(format!("{case_name}.json")))
        .unwrap_or_else(|e| panic!("{case_name}.json: {e}"));
    let fixture = std::fs::read(dir.join(format!("{case_name}.bin")))
        .unwrap_or_else(|e| panic!("{case_name}.bin (run make_fixture.py): {e}"));
    let case: Case = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{case_name}: {e}"));

    let i = &case.input;
    let input = TemplateInput {
        group_id: i.group_id.clone(),
        cluster_name: i.cluster_name.clone(),
        offering_name: i.offering_name.clone(),
        cpus: i.cpus,
        memory_mib: i.memory_mib,
        root_disk_gib: i.root_disk_gib,
        zone_name: i.zone_name.clone(),
        arch: i.arch.clone(),
        copied_labels: i.copied_labels.clone(),
        gpu: i.gpu.as_ref().map(|g| GpuSpec {
            resource_name: g.resource_name.clone(),
            count: g.count,
            gpu_type: g.gpu_type.clone(),
        }),
    };
    let s = &case.settings;
    let settings = TemplateSettings {
        pods: s.pods,
        system_reserved: s.system_reserved.clone().into(),
        kube_reserved: s.kube_reserved.clone().into(),
        eviction_hard_memory_mib: s.eviction_hard_memory_mib,
        eviction_hard_nodefs_percent: s.eviction_hard_nodefs_percent,
        default_root_disk_gib: s.default_root_disk_gib,
        extra_labels: s.extra_labels.clone(),
        extra_taints: s
            .extra_taints
            .iter()
            .map(|t| parse_taint(t).unwrap_or_else(|e| panic!("{case_name}: {e}")))
            .collect(),
        gpu_label: s.gpu_label.clone(),
    };
    let node = build_template_node(&input, &settings)
        .unwrap_or_else(|e| panic!("{case_name}: build_template_node failed: {e}"));
    (case, node, fixture)
}

fn check(case_name: &str) -> (Node, Vec<u8>, Vec<u8>) {
    let (case, node, fixture) = load(case_name);
    assert!(!case.description.is_empty());

    let fixture_node = Node::decode(fixture.as_slice())
        .unwrap_or_else(|e| panic!("{case_name}: fixture does not decode as v1.Node: {e}"));
    assert_eq!(
        fixture_node, node,
        "{case_name}: the fixture decoded with k8s-pb must equal the Node built from the same inputs"
    );

    let ours = encode_node(&node);
    let ours_decoded = Node::decode(ours.as_slice()).expect("our bytes decode");
    assert_eq!(
        ours_decoded, fixture_node,
        "{case_name}: our bytes decoded must equal the fixture decoded"
    );

    if case.byte_identical {
        assert_eq!(
            hex(&ours),
            hex(&fixture),
            "{case_name}: bytes must be identical to the independent encoder's"
        );
    } else {
        assert_ne!(
            ours, fixture,
            "{case_name}: expected the documented encoding difference; if the bytes now match, \
             set byte_identical to true in the JSON"
        );
    }
    (node, ours, fixture)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn plain_worker_matches_the_independent_fixture() {
    let (node, ours, _) = check("plain-worker");
    let labels = &node.metadata.as_ref().unwrap().labels;
    assert_eq!(
        labels
            .get("node.kubernetes.io/instance-type")
            .map(String::as_str),
        Some("Small_Instance_2x2")
    );
    assert!(!ours.is_empty());
}

#[test]
fn gpu_worker_matches_the_independent_fixture() {
    let (node, _, _) = check("gpu-worker");
    let status = node.status.as_ref().unwrap();
    assert_eq!(
        status.allocatable["nvidia.com/gpu"].string.as_deref(),
        Some("1")
    );
    assert_eq!(node.spec.as_ref().unwrap().taints.len(), 2);
}

#[test]
fn empty_label_value_differs_only_in_encoding() {
    let (node, ours, fixture) = check("empty-label-worker");
    let key = b"node-role.kubernetes.io/worker";
    // Python writes the empty value (field 2, length 0) right after the key; prost does not.
    let after_key = |bytes: &[u8]| {
        let at = bytes
            .windows(key.len())
            .position(|w| w == key)
            .expect("label key present");
        bytes[at + key.len()..at + key.len() + 2].to_vec()
    };
    assert_eq!(after_key(&fixture), vec![0x12, 0x00]);
    assert_ne!(after_key(&ours), vec![0x12, 0x00]);
    assert_eq!(
        fixture.len(),
        ours.len() + 2,
        "the only difference is those two bytes (and lengths)"
    );
    assert_eq!(
        node.metadata.as_ref().unwrap().labels["node-role.kubernetes.io/worker"],
        ""
    );
}

#[test]
fn every_fixture_is_checked() {
    let mut names: Vec<String> = std::fs::read_dir(fixture_dir())
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            (p.extension()? == "json")
                .then(|| p.file_stem().unwrap().to_string_lossy().into_owned())
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec!["empty-label-worker", "gpu-worker", "plain-worker"]
    );
}
