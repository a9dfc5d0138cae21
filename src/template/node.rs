//! The Node a new worker would be, built from the worker offering, the zone and the settings:
//! capacity and allocatable as the kubelet computes them, the labels the cloud-controller-manager
//! and a Ready worker give, the kubelet's healthy conditions and a stable name. It is the one
//! place that decides what the autoscaler simulates a new node to be, kept pure (no I/O, no
//! clock) so that the same input always gives the same template.

use std::collections::BTreeMap;

use k8s_pb::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Taint};
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::encoding::{binary_quantity_from_bytes, decimal_quantity_from_millis, quantity};
use super::labels::{
    sanitize_label_value, validate_label_key, validate_label_value, validate_taints,
};
use super::{
    GIB, GpuSpec, LABEL_ARCH, LABEL_HOSTNAME, LABEL_INSTANCE_TYPE, LABEL_OS, LABEL_REGION,
    LABEL_ZONE, MIB, NON_COPIED_LABELS, TemplateError, TemplateInput, TemplateSettings,
};

/// Builds the Node a new worker of `input.group_id` would be. Pure: same input, same Node
/// (the name's suffix is a hash of the inputs, not random).
pub fn build_template_node(
    input: &TemplateInput,
    settings: &TemplateSettings,
) -> Result<Node, TemplateError> {
    if input.group_id.trim().is_empty() {
        return Err(TemplateError::EmptyGroupId);
    }
    let zero = |resource| TemplateError::ZeroCapacity {
        offering: input.offering_name.clone(),
        cluster: input.cluster_name.clone(),
        resource,
    };
    if input.cpus == 0 {
        return Err(zero("cpus"));
    }
    if input.memory_mib == 0 {
        return Err(zero("memory"));
    }
    if settings.pods == 0 {
        return Err(TemplateError::InvalidSetting {
            setting: "pods",
            reason: "must be greater than 0, or no pod fits a new node".into(),
        });
    }
    if settings.eviction_hard_nodefs_percent >= 100 {
        return Err(TemplateError::InvalidSetting {
            setting: "eviction_hard_nodefs_percent",
            reason: format!(
                "{}% leaves no ephemeral storage; must be below 100",
                settings.eviction_hard_nodefs_percent
            ),
        });
    }
    if let Some(gpu) = &input.gpu {
        validate_gpu(gpu, &input.offering_name)?;
    }
    validate_taints(&settings.extra_taints)?;

    let name = template_node_name(input);
    let labels = template_labels(input, settings, &name)?;
    let (capacity, allocatable) = resources(input, settings)?;

    let taints = settings
        .extra_taints
        .iter()
        .map(|t| Taint {
            key: Some(t.key.clone()),
            value: Some(t.value.clone()),
            effect: Some(t.effect.as_str().to_string()),
            time_added: None,
        })
        .collect();

    Ok(Node {
        metadata: Some(ObjectMeta {
            name: Some(name),
            labels,
            ..ObjectMeta::default()
        }),
        spec: Some(NodeSpec {
            taints,
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            capacity,
            allocatable,
            conditions: ready_conditions(),
            ..NodeStatus::default()
        }),
    })
}

/// `template-node-for-<group>-<8 hex digits>`: the suffix is a hash of everything that shapes
/// the template, so a changed offering or zone gives a new name while repeated calls agree.
/// Eight digits keep the name a valid label value (≤ 63) for a UUID group id.
pub fn template_node_name(input: &TemplateInput) -> String {
    let mut h = Fnv1a::new();
    h.write_str(&input.group_id);
    h.write_str(&input.offering_name);
    h.write_u64(input.cpus);
    h.write_u64(input.memory_mib);
    h.write_u64(input.root_disk_gib.unwrap_or(0));
    h.write_str(&input.zone_name);
    h.write_str(&input.arch);
    if let Some(gpu) = &input.gpu {
        h.write_str(&gpu.resource_name);
        h.write_u64(gpu.count);
        h.write_str(&gpu.gpu_type);
    }
    let full = h.finish();
    let folded = (full >> 32) ^ (full & 0xffff_ffff);
    format!("template-node-for-{}-{folded:08x}", input.group_id)
}

fn template_labels(
    input: &TemplateInput,
    settings: &TemplateSettings,
    name: &str,
) -> Result<BTreeMap<String, String>, TemplateError> {
    let mut labels: BTreeMap<String, String> = input
        .copied_labels
        .iter()
        .filter(|(k, _)| !NON_COPIED_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();

    labels.insert(LABEL_OS.into(), "linux".into());
    labels.insert(LABEL_ARCH.into(), input.arch.clone());
    labels.insert(
        LABEL_INSTANCE_TYPE.into(),
        sanitize_label_value(&input.offering_name),
    );
    if !input.zone_name.is_empty() {
        let zone = sanitize_label_value(&input.zone_name);
        labels.insert(LABEL_ZONE.into(), zone.clone());
        labels.insert(LABEL_REGION.into(), zone);
    }
    if let (Some(gpu), Some(key)) = (&input.gpu, &settings.gpu_label) {
        validate_label_key(key).map_err(|reason| TemplateError::InvalidSetting {
            setting: "gpu_label",
            reason,
        })?;
        labels.insert(key.clone(), sanitize_label_value(&gpu.gpu_type));
    }
    for (key, value) in &settings.extra_labels {
        let invalid = |reason: String| TemplateError::InvalidLabel {
            key: key.clone(),
            value: value.clone(),
            reason,
        };
        if key == LABEL_HOSTNAME {
            return Err(invalid(
                "kubernetes.io/hostname is always the node name and cannot be configured".into(),
            ));
        }
        validate_label_key(key).map_err(invalid)?;
        validate_label_value(value).map_err(invalid)?;
        labels.insert(key.clone(), value.clone());
    }
    labels.insert(LABEL_HOSTNAME.into(), name.to_string());
    Ok(labels)
}

type ResourceMap = BTreeMap<String, Quantity>;

fn resources(
    input: &TemplateInput,
    settings: &TemplateSettings,
) -> Result<(ResourceMap, ResourceMap), TemplateError> {
    let too_large = |what| TemplateError::TooLarge {
        offering: input.offering_name.clone(),
        what,
    };
    let short =
        |resource, capacity: String, reserved: String| TemplateError::ReservationExceedsCapacity {
            offering: input.offering_name.clone(),
            cluster: input.cluster_name.clone(),
            resource,
            capacity,
            reserved,
        };
    let (sys, kube) = (&settings.system_reserved, &settings.kube_reserved);

    let cpu_cap = input
        .cpus
        .checked_mul(1000)
        .ok_or_else(|| too_large("cpus"))?;
    let cpu_res = sys
        .cpu_millis
        .checked_add(kube.cpu_millis)
        .ok_or_else(|| too_large("cpu reservation"))?;
    let cpu_alloc = positive_sub(cpu_cap, cpu_res).ok_or_else(|| {
        short(
            "cpu",
            decimal_quantity_from_millis(cpu_cap),
            decimal_quantity_from_millis(cpu_res),
        )
    })?;

    let mem_cap = input
        .memory_mib
        .checked_mul(MIB)
        .ok_or_else(|| too_large("memory"))?;
    let mem_res = sys
        .memory_mib
        .checked_add(kube.memory_mib)
        .and_then(|m| m.checked_add(settings.eviction_hard_memory_mib))
        .and_then(|m| m.checked_mul(MIB))
        .ok_or_else(|| too_large("memory reservation"))?;
    let mem_alloc = positive_sub(mem_cap, mem_res).ok_or_else(|| {
        short(
            "memory",
            binary_quantity_from_bytes(mem_cap),
            binary_quantity_from_bytes(mem_res),
        )
    })?;

    let disk_gib = input
        .root_disk_gib
        .unwrap_or(settings.default_root_disk_gib);
    if disk_gib == 0 {
        return Err(TemplateError::InvalidSetting {
            setting: "default_root_disk_gib",
            reason: format!(
                "the root disk of offering '{}' is unknown and the default is 0 GiB",
                input.offering_name
            ),
        });
    }
    let disk_cap = disk_gib
        .checked_mul(GIB)
        .ok_or_else(|| too_large("root disk"))?;
    let disk_res = sys
        .ephemeral_gib
        .checked_add(kube.ephemeral_gib)
        .and_then(|g| g.checked_mul(GIB))
        .and_then(|b| {
            b.checked_add(nodefs_eviction_bytes(
                disk_cap,
                settings.eviction_hard_nodefs_percent,
            ))
        })
        .ok_or_else(|| too_large("ephemeral-storage reservation"))?;
    let disk_alloc = positive_sub(disk_cap, disk_res).ok_or_else(|| {
        short(
            "ephemeral-storage",
            binary_quantity_from_bytes(disk_cap),
            binary_quantity_from_bytes(disk_res),
        )
    })?;

    let pods = settings
        .pods
        .checked_mul(1000)
        .map(decimal_quantity_from_millis)
        .ok_or_else(|| TemplateError::InvalidSetting {
            setting: "pods",
            reason: "too large".into(),
        })?;

    let mut capacity = BTreeMap::new();
    let mut allocatable = BTreeMap::new();
    let mut put = |name: &str, cap: String, alloc: String| {
        capacity.insert(name.to_string(), quantity(cap));
        allocatable.insert(name.to_string(), quantity(alloc));
    };
    put(
        "cpu",
        decimal_quantity_from_millis(cpu_cap),
        decimal_quantity_from_millis(cpu_alloc),
    );
    put(
        "memory",
        binary_quantity_from_bytes(mem_cap),
        binary_quantity_from_bytes(mem_alloc),
    );
    put(
        "ephemeral-storage",
        binary_quantity_from_bytes(disk_cap),
        binary_quantity_from_bytes(disk_alloc),
    );
    put("pods", pods.clone(), pods);
    if let Some(gpu) = &input.gpu {
        let count = gpu
            .count
            .checked_mul(1000)
            .map(decimal_quantity_from_millis)
            .ok_or_else(|| too_large("GPU count"))?;
        put(&gpu.resource_name, count.clone(), count);
    }
    Ok((capacity, allocatable))
}

/// `cap - reserved` when something is left.
fn positive_sub(cap: u64, reserved: u64) -> Option<u64> {
    cap.checked_sub(reserved).filter(|left| *left > 0)
}

/// The kubelet turns a percentage threshold into bytes as
/// `int64(float64(capacity) * float64(float32(pct)/100))` (`ParsePercentage` yields a float32);
/// the same arithmetic keeps allocatable storage byte-for-byte equal to a real node's.
fn nodefs_eviction_bytes(capacity: u64, percent: u8) -> u64 {
    let fraction = f32::from(percent) / 100.0_f32;
    // Truncation toward zero is what Go's int64() conversion does.
    (capacity as f64 * f64::from(fraction)) as u64
}

/// The kubelet's conditions of a healthy node, in the order it reports them.
fn ready_conditions() -> Vec<NodeCondition> {
    let cond = |type_: &str, status: &str, reason: &str, message: &str| NodeCondition {
        r#type: Some(type_.to_string()),
        status: Some(status.to_string()),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        ..NodeCondition::default()
    };
    vec![
        cond(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        ),
        cond(
            "DiskPressure",
            "False",
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure",
        ),
        cond(
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
        ),
        cond(
            "Ready",
            "True",
            "KubeletReady",
            "kubelet is posting ready status",
        ),
    ]
}

fn validate_gpu(gpu: &GpuSpec, offering: &str) -> Result<(), TemplateError> {
    let err = |reason: String| TemplateError::InvalidGpu {
        offering: offering.to_string(),
        reason,
    };
    if gpu.count == 0 {
        return Err(err("count is 0; leave the GPU out instead".into()));
    }
    validate_label_key(&gpu.resource_name)
        .map_err(|r| err(format!("resource name '{}': {r}", gpu.resource_name)))
}

/// 64-bit FNV-1a: tiny, stable across releases and platforms (unlike `DefaultHasher`), which
/// keeps template names stable across restarts.
struct Fnv1a(u64);

impl Fnv1a {
    fn new() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn write_str(&mut self, s: &str) {
        self.write(s.as_bytes());
        // A separator keeps ("ab","c") and ("a","bc") apart.
        self.write(&[0xff]);
    }
    fn write_u64(&mut self, v: u64) {
        self.write(&v.to_le_bytes());
    }
    fn finish(&self) -> u64 {
        self.0
    }
}
