use super::*;
use k8s_pb::api::core::v1::{Node, NodeStatus};
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use prost::Message;

fn input() -> TemplateInput {
    TemplateInput {
        group_id: "9f1c2b7e-2d4a-4c8e-9b1a-0d6e5f4a3b21".into(),
        cluster_name: "prod".into(),
        offering_name: "CKS Medium (4 vCPU, 4GB)".into(),
        cpus: 4,
        memory_mib: 4096,
        root_disk_gib: Some(50),
        zone_name: "zone-1".into(),
        arch: "amd64".into(),
        copied_labels: BTreeMap::new(),
        gpu: None,
    }
}

fn decode(node: &Node) -> Node {
    let bytes = encode_node(node);
    Node::decode(bytes.as_slice()).expect("template bytes decode as a v1.Node")
}

fn labels(n: &Node) -> &BTreeMap<String, String> {
    &n.metadata.as_ref().unwrap().labels
}

fn q(map: &BTreeMap<String, Quantity>, k: &str) -> String {
    map.get(k)
        .and_then(|q| q.string.clone())
        .unwrap_or_else(|| panic!("no quantity {k} in {map:?}"))
}

fn status(n: &Node) -> &NodeStatus {
    n.status.as_ref().unwrap()
}

#[test]
fn decoded_bytes_carry_every_field_of_a_plain_worker() {
    let node = build_template_node(&input(), &TemplateSettings::default()).unwrap();
    let back = decode(&node);
    assert_eq!(back, node);

    let meta = back.metadata.as_ref().unwrap();
    let name = meta.name.clone().unwrap();
    assert!(
        name.starts_with("template-node-for-9f1c2b7e-2d4a-4c8e-9b1a-0d6e5f4a3b21-"),
        "{name}"
    );
    assert_eq!(
        name.len(),
        63,
        "UUID group id + 8 hex digits is a valid label value"
    );
    let expected_labels: BTreeMap<String, String> = [
        ("kubernetes.io/arch", "amd64"),
        ("kubernetes.io/hostname", name.as_str()),
        ("kubernetes.io/os", "linux"),
        (
            "node.kubernetes.io/instance-type",
            "CKS_Medium__4_vCPU__4GB",
        ),
        ("topology.kubernetes.io/region", "zone-1"),
        ("topology.kubernetes.io/zone", "zone-1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(meta.labels, expected_labels);
    assert!(meta.annotations.is_empty());

    let spec = back.spec.as_ref().unwrap();
    assert_eq!(
        spec.provider_id, None,
        "providerID stays empty on a template"
    );
    assert!(spec.taints.is_empty());
    assert_eq!(spec.unschedulable, None);

    let st = status(&back);
    assert_eq!(q(&st.capacity, "cpu"), "4");
    assert_eq!(q(&st.capacity, "memory"), "4Gi");
    assert_eq!(q(&st.capacity, "pods"), "110");
    assert_eq!(q(&st.capacity, "ephemeral-storage"), "50Gi");
    assert_eq!(st.capacity.len(), 4);
    // Kubelet defaults: nothing reserved, eviction memory.available<100Mi, nodefs<10%.
    assert_eq!(q(&st.allocatable, "cpu"), "4");
    assert_eq!(q(&st.allocatable, "memory"), "3996Mi");
    assert_eq!(q(&st.allocatable, "pods"), "110");
    // 50Gi - int64(53687091200 * float64(float32(0.1))) = 53687091200 - 5368709200
    assert_eq!(q(&st.allocatable, "ephemeral-storage"), "48318382000");
    assert_eq!(st.allocatable.len(), 4);

    let conds: Vec<(&str, &str, &str)> = st
        .conditions
        .iter()
        .map(|c| {
            (
                c.r#type.as_deref().unwrap(),
                c.status.as_deref().unwrap(),
                c.reason.as_deref().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        conds,
        vec![
            ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID"),
            ("Ready", "True", "KubeletReady"),
        ]
    );
    assert!(
        st.conditions
            .iter()
            .all(|c| c.last_heartbeat_time.is_none())
    );
}

#[test]
fn allocatable_subtracts_both_reservations_and_eviction_thresholds() {
    let settings = TemplateSettings {
        pods: 64,
        system_reserved: Reserved {
            cpu_millis: 100,
            memory_mib: 256,
            ephemeral_gib: 1,
        },
        kube_reserved: Reserved {
            cpu_millis: 200,
            memory_mib: 512,
            ephemeral_gib: 1,
        },
        eviction_hard_memory_mib: 100,
        eviction_hard_nodefs_percent: 0,
        ..TemplateSettings::default()
    };
    let node = decode(&build_template_node(&input(), &settings).unwrap());
    let st = status(&node);
    assert_eq!(q(&st.capacity, "cpu"), "4");
    assert_eq!(q(&st.allocatable, "cpu"), "3700m");
    assert_eq!(q(&st.allocatable, "memory"), "3228Mi"); // 4096 - 256 - 512 - 100
    assert_eq!(q(&st.allocatable, "ephemeral-storage"), "48Gi"); // 50 - 1 - 1
    assert_eq!(q(&st.capacity, "pods"), "64");
    assert_eq!(q(&st.allocatable, "pods"), "64");
}

#[test]
fn missing_root_disk_uses_the_configured_default() {
    let mut i = input();
    i.root_disk_gib = None;
    let node = build_template_node(&i, &TemplateSettings::default()).unwrap();
    let st = status(&node);
    assert_eq!(q(&st.capacity, "ephemeral-storage"), "8Gi");
    // 8589934592 - int64(8589934592 * float64(float32(0.1))) as the kubelet computes it.
    assert_eq!(q(&st.allocatable, "ephemeral-storage"), "7730941120");
}

#[test]
fn gpu_adds_capacity_label_and_configured_taint() {
    let mut i = input();
    i.gpu = Some(GpuSpec {
        resource_name: "nvidia.com/gpu".into(),
        count: 2,
        gpu_type: "NVIDIA A100 80GB".into(),
    });
    let settings = TemplateSettings {
        gpu_label: Some("cloudstack.apache.org/gpu".into()),
        extra_taints: vec![parse_taint("nvidia.com/gpu=present:NoSchedule").unwrap()],
        ..TemplateSettings::default()
    };
    let node = decode(&build_template_node(&i, &settings).unwrap());
    let st = status(&node);
    assert_eq!(q(&st.capacity, "nvidia.com/gpu"), "2");
    assert_eq!(q(&st.allocatable, "nvidia.com/gpu"), "2");
    assert_eq!(
        labels(&node)
            .get("cloudstack.apache.org/gpu")
            .map(String::as_str),
        Some("NVIDIA_A100_80GB")
    );
    let taints = &node.spec.as_ref().unwrap().taints;
    assert_eq!(taints.len(), 1);
    assert_eq!(taints[0].key.as_deref(), Some("nvidia.com/gpu"));
    assert_eq!(taints[0].value.as_deref(), Some("present"));
    assert_eq!(taints[0].effect.as_deref(), Some("NoSchedule"));
    assert_eq!(taints[0].time_added, None);
}

#[test]
fn gpu_label_is_absent_without_a_gpu() {
    let settings = TemplateSettings {
        gpu_label: Some("cloudstack.apache.org/gpu".into()),
        ..TemplateSettings::default()
    };
    let node = build_template_node(&input(), &settings).unwrap();
    assert!(!labels(&node).contains_key("cloudstack.apache.org/gpu"));
    assert!(!status(&node).capacity.contains_key("nvidia.com/gpu"));
}

#[test]
fn copied_labels_keep_custom_ones_and_drop_identity_and_recomputed_ones() {
    let mut i = input();
    i.copied_labels = [
        ("kubernetes.io/hostname", "prod-node-abc123"),
        ("node.kubernetes.io/instance-type", "Old_Offering"),
        ("beta.kubernetes.io/instance-type", "Old_Offering"),
        ("failure-domain.beta.kubernetes.io/zone", "old-zone"),
        ("topology.kubernetes.io/zone", "old-zone"),
        ("team", "payments"),
        ("node-role.kubernetes.io/worker", ""),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let node = build_template_node(&i, &TemplateSettings::default()).unwrap();
    let l = labels(&node);
    assert_eq!(l.get("team").map(String::as_str), Some("payments"));
    assert_eq!(
        l.get("node-role.kubernetes.io/worker").map(String::as_str),
        Some("")
    );
    assert_eq!(
        l.get("node.kubernetes.io/instance-type")
            .map(String::as_str),
        Some("CKS_Medium__4_vCPU__4GB")
    );
    assert_eq!(
        l.get("topology.kubernetes.io/zone").map(String::as_str),
        Some("zone-1")
    );
    assert_eq!(
        l.get("kubernetes.io/hostname"),
        node.metadata.as_ref().unwrap().name.as_ref()
    );
    assert!(!l.contains_key("beta.kubernetes.io/instance-type"));
    assert!(!l.contains_key("failure-domain.beta.kubernetes.io/zone"));
}

#[test]
fn configured_labels_win_over_computed_and_copied_ones() {
    let mut i = input();
    i.copied_labels.insert("team".into(), "payments".into());
    let settings = TemplateSettings {
        extra_labels: [
            ("team", "search"),
            ("topology.kubernetes.io/region", "eu-west"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        ..TemplateSettings::default()
    };
    let node = build_template_node(&i, &settings).unwrap();
    let l = labels(&node);
    assert_eq!(l.get("team").map(String::as_str), Some("search"));
    assert_eq!(
        l.get("topology.kubernetes.io/region").map(String::as_str),
        Some("eu-west")
    );
    assert_eq!(
        l.get("topology.kubernetes.io/zone").map(String::as_str),
        Some("zone-1")
    );
}

#[test]
fn configured_hostname_or_invalid_label_is_refused() {
    for (k, v, needle) in [
        ("kubernetes.io/hostname", "x", "always the node name"),
        ("Bad Key", "x", "key name 'Bad Key'"),
        ("UPPER.example/key", "x", "key prefix 'UPPER.example'"),
        ("team", "-bad", "value '-bad'"),
    ] {
        let settings = TemplateSettings {
            extra_labels: [(k.to_string(), v.to_string())].into_iter().collect(),
            ..TemplateSettings::default()
        };
        let err = build_template_node(&input(), &settings).unwrap_err();
        assert!(
            matches!(err, TemplateError::InvalidLabel { .. }),
            "{k}: {err:?}"
        );
        assert!(err.to_string().contains(needle), "{k}: {err}");
    }
}

#[test]
fn empty_zone_leaves_topology_labels_out() {
    let mut i = input();
    i.zone_name = String::new();
    let node = build_template_node(&i, &TemplateSettings::default()).unwrap();
    assert!(!labels(&node).contains_key(LABEL_ZONE));
    assert!(!labels(&node).contains_key(LABEL_REGION));
}

#[test]
fn zero_cpus_or_memory_is_an_error_naming_the_offering() {
    let mut i = input();
    i.cpus = 0;
    let err = build_template_node(&i, &TemplateSettings::default()).unwrap_err();
    assert_eq!(
        err,
        TemplateError::ZeroCapacity {
            offering: "CKS Medium (4 vCPU, 4GB)".into(),
            cluster: "prod".into(),
            resource: "cpus"
        }
    );
    assert!(
        err.to_string().contains("'CKS Medium (4 vCPU, 4GB)'"),
        "{err}"
    );

    let mut i = input();
    i.memory_mib = 0;
    let err = build_template_node(&i, &TemplateSettings::default()).unwrap_err();
    assert!(matches!(
        err,
        TemplateError::ZeroCapacity {
            resource: "memory",
            ..
        }
    ));
    assert!(err.to_string().contains("0 memory"), "{err}");
}

#[test]
fn reservations_that_exhaust_a_resource_are_refused() {
    let cases = [
        (
            Reserved {
                cpu_millis: 4000,
                ..Reserved::default()
            },
            "cpu",
            "capacity 4, reserved 4",
        ),
        (
            Reserved {
                memory_mib: 4000,
                ..Reserved::default()
            },
            "memory",
            "capacity 4Gi, reserved 4100Mi",
        ),
        (
            Reserved {
                ephemeral_gib: 46,
                ..Reserved::default()
            },
            "ephemeral-storage",
            "capacity 50Gi",
        ),
    ];
    for (reserved, resource, text) in cases {
        let settings = TemplateSettings {
            kube_reserved: reserved,
            ..TemplateSettings::default()
        };
        let err = build_template_node(&input(), &settings).unwrap_err();
        assert!(
            matches!(&err, TemplateError::ReservationExceedsCapacity { resource: r, .. } if *r == resource),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains(text), "{msg}");
        assert!(msg.contains("'CKS Medium (4 vCPU, 4GB)'"), "{msg}");
    }
}

#[test]
fn other_unusable_inputs_are_refused() {
    let mut i = input();
    i.group_id = " ".into();
    assert_eq!(
        build_template_node(&i, &TemplateSettings::default()),
        Err(TemplateError::EmptyGroupId)
    );

    let zero_pods = TemplateSettings {
        pods: 0,
        ..TemplateSettings::default()
    };
    assert!(matches!(
        build_template_node(&input(), &zero_pods),
        Err(TemplateError::InvalidSetting {
            setting: "pods",
            ..
        })
    ));

    let mut i = input();
    i.gpu = Some(GpuSpec {
        resource_name: "nvidia.com/gpu".into(),
        count: 0,
        gpu_type: "A100".into(),
    });
    assert!(matches!(
        build_template_node(&i, &TemplateSettings::default()),
        Err(TemplateError::InvalidGpu { .. })
    ));

    let dup = TemplateSettings {
        extra_taints: vec![
            parse_taint("a=1:NoSchedule").unwrap(),
            parse_taint("a=2:NoSchedule").unwrap(),
        ],
        ..TemplateSettings::default()
    };
    let err = build_template_node(&input(), &dup).unwrap_err();
    assert!(err.to_string().contains("same key and effect"), "{err}");

    let mut i = input();
    i.root_disk_gib = None;
    let no_disk = TemplateSettings {
        default_root_disk_gib: 0,
        ..TemplateSettings::default()
    };
    assert!(matches!(
        build_template_node(&i, &no_disk),
        Err(TemplateError::InvalidSetting {
            setting: "default_root_disk_gib",
            ..
        })
    ));
}

#[test]
fn name_is_stable_for_equal_inputs_and_changes_with_the_offering() {
    let a = template_node_name(&input());
    assert_eq!(a, template_node_name(&input()));
    let mut other = input();
    other.offering_name = "CKS Large".into();
    assert_ne!(a, template_node_name(&other));
    let mut other = input();
    other.memory_mib = 8192;
    assert_ne!(a, template_node_name(&other));
    let suffix = a.rsplit('-').next().unwrap();
    assert_eq!(suffix.len(), 8);
    assert!(suffix.bytes().all(|b| b.is_ascii_hexdigit()));
}

#[test]
fn encode_is_never_empty() {
    let bytes = encode_node(&Node::default());
    assert_eq!(bytes, vec![0x0a, 0x00], "empty metadata, as Go writes it");
    assert_eq!(
        Node::decode(bytes.as_slice()).unwrap().metadata,
        Some(ObjectMeta::default())
    );
    let node = build_template_node(&input(), &TemplateSettings::default()).unwrap();
    assert!(encode_node(&node).len() > 100);
}

#[test]
fn sanitize_matches_the_cloud_controller_manager() {
    let long = "a".repeat(70);
    let long_cut_on_dash = format!("{}-b", "a".repeat(62));
    for (input, want) in [
        ("Small Instance", "Small_Instance"),
        ("CKS Medium (4 vCPU, 4GB)", "CKS_Medium__4_vCPU__4GB"),
        ("m1.large", "m1.large"),
        ("  spaced  ", "spaced"),
        ("--_.edge._--", "edge"),
        ("Größe-L", "Gr__e-L"),
        ("GPU™ A100", "GPU__A100"),
        ("***", ""),
        ("", ""),
        ("zone_1", "zone_1"),
        (long.as_str(), &long[..63]),
        // Cut at 63 leaves a trailing '-', which is trimmed again.
        (long_cut_on_dash.as_str(), &long_cut_on_dash[..62]),
    ] {
        assert_eq!(sanitize_label_value(input), want, "input {input:?}");
        assert!(validate_label_value(&sanitize_label_value(input)).is_ok());
    }
}

#[test]
fn parse_taint_table() {
    let ok = |s: &str, k: &str, v: &str, e: TaintEffect| {
        assert_eq!(
            parse_taint(s).unwrap(),
            TaintSpec {
                key: k.into(),
                value: v.into(),
                effect: e
            },
            "{s}"
        );
    };
    ok(
        "dedicated=gpu:NoSchedule",
        "dedicated",
        "gpu",
        TaintEffect::NoSchedule,
    );
    ok(
        "dedicated:PreferNoSchedule",
        "dedicated",
        "",
        TaintEffect::PreferNoSchedule,
    );
    ok(
        "example.com/special=:NoExecute",
        "example.com/special",
        "",
        TaintEffect::NoExecute,
    );
    for (bad, needle) in [
        ("dedicated=gpu", "missing ':Effect'"),
        ("dedicated=gpu:NoSchedul", "unknown effect 'NoSchedul'"),
        ("dedicated=gpu:noschedule", "unknown effect"),
        ("=gpu:NoSchedule", "key is empty"),
        ("bad key=gpu:NoSchedule", "key name 'bad key'"),
        ("key=bad value:NoSchedule", "value 'bad value'"),
    ] {
        let err = parse_taint(bad).unwrap_err();
        assert!(matches!(err, TemplateError::InvalidTaint { .. }));
        let msg = err.to_string();
        assert!(msg.contains(needle), "{bad}: {msg}");
        assert!(msg.contains(bad), "error names the input: {msg}");
    }
}

#[test]
fn gpu_from_offering_table() {
    let details = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let none = BTreeMap::new();
    let gpu = |r: &str, c: u64, t: &str| {
        Some(GpuSpec {
            resource_name: r.into(),
            count: c,
            gpu_type: t.into(),
        })
    };

    assert_eq!(gpu_from_offering(&none, None, None, None), None);
    assert_eq!(gpu_from_offering(&none, Some(0), None, None), None);
    assert_eq!(
        gpu_from_offering(&details(&[("rootdisksize", "20")]), None, None, None),
        None
    );
    // CloudStack 4.21+: count, card, vGPU profile.
    assert_eq!(
        gpu_from_offering(&none, Some(2), Some("NVIDIA A100"), Some("passthrough")),
        gpu("nvidia.com/gpu", 2, "NVIDIA A100")
    );
    assert_eq!(
        gpu_from_offering(
            &none,
            Some(1),
            Some("NVIDIA RTX 4090"),
            Some("grid_rtx4090-8q")
        ),
        gpu("nvidia.com/gpu", 1, "grid_rtx4090-8q")
    );
    assert_eq!(
        gpu_from_offering(&none, None, Some("NVIDIA L4"), None),
        gpu("nvidia.com/gpu", 1, "NVIDIA L4")
    );
    assert_eq!(
        gpu_from_offering(&none, Some(4), Some("AMD Instinct MI210"), None),
        gpu("amd.com/gpu", 4, "AMD Instinct MI210")
    );
    // Older CloudStack: serviceofferingdetails.
    assert_eq!(
        gpu_from_offering(
            &details(&[
                ("pciDevice", "Group of NVIDIA A6000 GPUs"),
                ("vgpuType", "A6000-8A")
            ]),
            None,
            None,
            None
        ),
        gpu("nvidia.com/gpu", 1, "A6000-8A")
    );
    assert_eq!(
        gpu_from_offering(
            &details(&[
                ("pciDevice", "Group of NVIDIA A6000 GPUs"),
                ("vgpuType", "passthrough")
            ]),
            None,
            None,
            None
        ),
        gpu("nvidia.com/gpu", 1, "Group of NVIDIA A6000 GPUs")
    );
    assert_eq!(
        gpu_from_offering(
            &details(&[("pcidevice", " Group of Intel GPUs ")]),
            Some(0),
            None,
            None
        ),
        gpu("gpu.intel.com/i915", 1, "Group of Intel GPUs")
    );
}

#[test]
fn arch_mapping() {
    assert_eq!(kubernetes_arch(None), "amd64");
    assert_eq!(kubernetes_arch(Some("")), "amd64");
    assert_eq!(kubernetes_arch(Some("x86_64")), "amd64");
    assert_eq!(kubernetes_arch(Some("aarch64")), "arm64");
    assert_eq!(kubernetes_arch(Some("ARM64")), "arm64");
    assert_eq!(kubernetes_arch(Some("s390x")), "s390x");
}

#[test]
fn quantities_are_canonical() {
    for (millis, want) in [
        (0, "0"),
        (1, "1m"),
        (1500, "1500m"),
        (4000, "4"),
        (110_000, "110"),
        (1_000_000, "1k"),
        (2_500_000, "2500"),
    ] {
        assert_eq!(decimal_quantity_from_millis(millis), want, "{millis}");
    }
    for (bytes, want) in [
        (0, "0"),
        (512, "512"),
        (1000, "1k"),
        (1024, "1Ki"),
        (1536, "1536"),
        (4096 * MIB, "4Gi"),
        (3996 * MIB, "3996Mi"),
        (1 << 60, "1Ei"),
        (15 << 60, "15Ei"),
    ] {
        assert_eq!(binary_quantity_from_bytes(bytes), want, "{bytes}");
    }
}

#[test]
fn label_key_validation() {
    for ok in ["team", "example.com/team", "a.b-c/x_y.z", "nvidia.com/gpu"] {
        assert!(validate_label_key(ok).is_ok(), "{ok}");
    }
    for bad in ["", "/x", "Example.com/x", "a/", "-x", &"k".repeat(64)] {
        assert!(validate_label_key(bad).is_err(), "{bad}");
    }
}
