//! NodeGroupTemplateNodeInfo: the Kubernetes Node a new worker of a group would be.
//!
//! This module owns the pure construction of that Node ([`build_template_node`]) and its
//! encoding ([`encode_node`]): Kubernetes protobuf, the bytes Go's `v1.Node.Marshal()` gives,
//! with no `k8s\0` envelope. It knows nothing about gRPC, CloudStack calls or time; the caller
//! feeds it the worker offering, the zone and (when one exists) the labels of a Ready worker.
//!
//! What the autoscaler needs from the template (and so what is filled in):
//! - labels pods select on: `kubernetes.io/os`, `kubernetes.io/arch`,
//!   `node.kubernetes.io/instance-type` (the offering name sanitised exactly as CloudStack's
//!   cloud-controller-manager does, see [`sanitize_label_value`]), `topology.kubernetes.io/zone`
//!   (the sanitised zone name) and `topology.kubernetes.io/region` (the zone name again, as the
//!   CCM's zone interface reports it; the newest CCM leaves the region unset, so an operator
//!   who selects on region can override it with a configured label), `kubernetes.io/hostname`,
//!   labels copied from a Ready worker, configured labels and the GPU label;
//! - `status.capacity` and `status.allocatable` for `cpu`, `memory`, `pods`,
//!   `ephemeral-storage` and the GPU resource, computed the way the kubelet computes them
//!   (allocatable = capacity − kube-reserved − system-reserved − hard eviction threshold);
//! - a `Ready=True` condition (plus the kubelet's pressure conditions, all `False`);
//! - configured taints. `spec.providerID` stays empty: the autoscaler ignores it on templates.
//!
//! Quantities are written in Kubernetes' canonical form (`4Gi`, `3996Mi`, `1500m`, `110`),
//! because Go's `Quantity.Marshal` writes `Quantity.String()`, which is canonical.
//!
//! Known approximations: a real node reports slightly less memory than the offering (the guest
//! kernel keeps some) and slightly less disk than the root volume (file-system overhead). The
//! template therefore slightly overstates both; configure `kube_reserved`/`system_reserved` to
//! absorb the difference if pods sized to the very edge of a node matter. Once a real worker
//! exists the autoscaler uses it instead of the template.

use std::collections::BTreeMap;

use k8s_pb::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Taint};
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use prost::Message;

/// Label: operating system (always `linux` on CKS).
pub const LABEL_OS: &str = "kubernetes.io/os";
/// Label: CPU architecture in Kubernetes' spelling (`amd64`, `arm64`).
pub const LABEL_ARCH: &str = "kubernetes.io/arch";
/// Label: instance type, the sanitised service offering name.
pub const LABEL_INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// Label: zone.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// Label: region.
pub const LABEL_REGION: &str = "topology.kubernetes.io/region";
/// Label: host name; always the node name.
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";

/// Labels of a Ready worker that are never copied into a template: they identify that one node
/// (hostname), or they are recomputed from the offering and zone (a changed offering must change
/// the template), or they are deprecated aliases the autoscaler rebuilds from the stable labels
/// (copying a stale alias could contradict the recomputed stable label).
pub const NON_COPIED_LABELS: &[&str] = &[
    LABEL_HOSTNAME,
    LABEL_INSTANCE_TYPE,
    LABEL_ZONE,
    LABEL_REGION,
    LABEL_OS,
    LABEL_ARCH,
    "beta.kubernetes.io/instance-type",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "cluster-autoscaler.kubernetes.io/template-node",
];

/// The extended resource NVIDIA's device plugin advertises.
pub const DEFAULT_GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Root disk size of a CKS node when the cluster was created without `noderootdisksize`
/// (CloudStack's `CreateKubernetesClusterCmd` default, in GB).
pub const CKS_DEFAULT_ROOT_DISK_GIB: u64 = 8;

/// Pods per node: the kubelet's `--max-pods` default.
pub const KUBELET_DEFAULT_MAX_PODS: u64 = 110;

/// The kubelet's default `evictionHard` `memory.available` threshold (100Mi).
pub const KUBELET_DEFAULT_EVICTION_MEMORY_MIB: u64 = 100;

/// The kubelet's default `evictionHard` `nodefs.available` threshold (10%).
pub const KUBELET_DEFAULT_EVICTION_NODEFS_PERCENT: u8 = 10;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// GPUs a worker of the group gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSpec {
    /// Extended resource name, e.g. `nvidia.com/gpu`.
    pub resource_name: String,
    /// Devices per node (> 0).
    pub count: u64,
    /// Human GPU type (card or vGPU profile name), used as the GPU label value after
    /// sanitising and reported by GetAvailableGPUTypes.
    pub gpu_type: String,
}

/// A taint's effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaintEffect {
    /// `NoSchedule`
    NoSchedule,
    /// `PreferNoSchedule`
    PreferNoSchedule,
    /// `NoExecute`
    NoExecute,
}

impl TaintEffect {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }

    /// Parses the exact Kubernetes spelling (as `kubectl taint` requires).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "NoSchedule" => Some(TaintEffect::NoSchedule),
            "PreferNoSchedule" => Some(TaintEffect::PreferNoSchedule),
            "NoExecute" => Some(TaintEffect::NoExecute),
            _ => None,
        }
    }
}

/// A taint every worker of the group carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaintSpec {
    /// Taint key (a qualified name, like a label key).
    pub key: String,
    /// Taint value; may be empty.
    pub value: String,
    /// Effect.
    pub effect: TaintEffect,
}

/// A kubelet reservation (`--system-reserved` or `--kube-reserved`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reserved {
    /// CPU in millicores.
    pub cpu_millis: u64,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Ephemeral storage in GiB.
    pub ephemeral_gib: u64,
}

/// What describes one group's future worker: the worker offering, the cluster and its zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateInput {
    /// Node group id (used in the node name).
    pub group_id: String,
    /// CKS cluster name (used in error messages).
    pub cluster_name: String,
    /// Worker service offering name, as CloudStack reports it (sanitised here).
    pub offering_name: String,
    /// `cpunumber` of the offering.
    pub cpus: u64,
    /// `memory` of the offering, in MiB.
    pub memory_mib: u64,
    /// Root disk size in GiB when known (cluster's node root disk size or the offering's).
    pub root_disk_gib: Option<u64>,
    /// Zone name. When empty the topology labels are left out.
    pub zone_name: String,
    /// Kubernetes architecture (`amd64`, `arm64`); see [`kubernetes_arch`].
    pub arch: String,
    /// Labels of a Ready worker of the group, when one exists; identity labels are dropped
    /// (see [`NON_COPIED_LABELS`]).
    pub copied_labels: BTreeMap<String, String>,
    /// GPUs of the worker offering, if any.
    pub gpu: Option<GpuSpec>,
}

/// Operator settings that shape templates (the same for every group unless configured per
/// cluster by the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateSettings {
    /// Pods per node (the kubelet's `--max-pods`); must be > 0 or nothing fits.
    pub pods: u64,
    /// The kubelet's `--system-reserved`.
    pub system_reserved: Reserved,
    /// The kubelet's `--kube-reserved`.
    pub kube_reserved: Reserved,
    /// The kubelet's hard eviction threshold `memory.available`, in MiB.
    pub eviction_hard_memory_mib: u64,
    /// The kubelet's hard eviction threshold `nodefs.available`, in percent of the root disk.
    pub eviction_hard_nodefs_percent: u8,
    /// Root disk size used when the input does not know it, in GiB.
    pub default_root_disk_gib: u64,
    /// Labels added to every template (they win over computed and copied labels, except
    /// `kubernetes.io/hostname`, which may not be set).
    pub extra_labels: BTreeMap<String, String>,
    /// Taints of every template.
    pub extra_taints: Vec<TaintSpec>,
    /// Label key carrying the GPU type (what GPULabel answers), when configured.
    pub gpu_label: Option<String>,
}

impl Default for TemplateSettings {
    /// The kubelet's own defaults (110 pods, no reservations, `memory.available<100Mi`,
    /// `nodefs.available<10%`) and CKS's default 8 GiB root disk: what an unconfigured CKS worker
    /// reports.
    fn default() -> Self {
        TemplateSettings {
            pods: KUBELET_DEFAULT_MAX_PODS,
            system_reserved: Reserved::default(),
            kube_reserved: Reserved::default(),
            eviction_hard_memory_mib: KUBELET_DEFAULT_EVICTION_MEMORY_MIB,
            eviction_hard_nodefs_percent: KUBELET_DEFAULT_EVICTION_NODEFS_PERCENT,
            default_root_disk_gib: CKS_DEFAULT_ROOT_DISK_GIB,
            extra_labels: BTreeMap::new(),
            extra_taints: Vec::new(),
            gpu_label: None,
        }
    }
}

/// Why no template could be built. Every message names the offering or setting at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The group id is empty.
    #[error("node group id is empty; cannot name a template node")]
    EmptyGroupId,
    /// The offering reports no CPUs or no memory (a custom offering without values, or a
    /// CloudStack answer missing the field).
    #[error(
        "service offering '{offering}' of cluster '{cluster}' reports 0 {resource}; \
         cannot build a template node"
    )]
    ZeroCapacity {
        /// Offering name.
        offering: String,
        /// Cluster name.
        cluster: String,
        /// `cpus` or `memory`.
        resource: &'static str,
    },
    /// Reservations and eviction thresholds leave nothing allocatable.
    #[error(
        "reservations leave no allocatable {resource} on service offering '{offering}' of cluster \
         '{cluster}': capacity {capacity}, reserved {reserved} (system-reserved + kube-reserved + \
         hard eviction threshold)"
    )]
    ReservationExceedsCapacity {
        /// Offering name.
        offering: String,
        /// Cluster name.
        cluster: String,
        /// Resource name (`cpu`, `memory`, `ephemeral-storage`).
        resource: &'static str,
        /// Capacity as a quantity.
        capacity: String,
        /// Total reserved as a quantity.
        reserved: String,
    },
    /// A number does not fit the Kubernetes quantity range.
    #[error("{what} of service offering '{offering}' is too large")]
    TooLarge {
        /// Offering name.
        offering: String,
        /// Which number.
        what: &'static str,
    },
    /// A setting is unusable.
    #[error("template setting {setting}: {reason}")]
    InvalidSetting {
        /// Setting name.
        setting: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A configured label is not a valid Kubernetes label.
    #[error("label '{key}={value}': {reason}")]
    InvalidLabel {
        /// Label key.
        key: String,
        /// Label value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// A taint is malformed.
    #[error("taint '{input}': {reason}")]
    InvalidTaint {
        /// The taint as given.
        input: String,
        /// What is wrong.
        reason: String,
    },
    /// The GPU description is unusable.
    #[error("GPU of service offering '{offering}': {reason}")]
    InvalidGpu {
        /// Offering name.
        offering: String,
        /// What is wrong.
        reason: String,
    },
}

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

/// Encodes a Node as Kubernetes protobuf (what Go's `v1.Node.Marshal()` produces; no
/// `k8s\0` envelope). Never empty: a Node with nothing set still encodes its (empty)
/// `metadata`, as Go always writes that field, so a caller can never answer OK with empty
/// `nodeBytes`.
///
/// Bytes differ from Go's in two respects only, neither visible after decoding: Go also writes
/// every empty non-pointer field (`namespace: ""`, `generation: 0`, an empty
/// `creationTimestamp`, …) while prost leaves unset fields out; and Go writes the value of a
/// map entry even when it is empty (a label `key=""`) while prost leaves an entry's default
/// value out. Go's `Unmarshal` gives the same struct either way.
pub fn encode_node(node: &Node) -> Vec<u8> {
    let bytes = node.encode_to_vec();
    if !bytes.is_empty() {
        return bytes;
    }
    let mut with_meta = node.clone();
    with_meta.metadata = Some(ObjectMeta::default());
    with_meta.encode_to_vec()
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

/// Sanitises a string into a label value the way CloudStack's cloud-controller-manager does for
/// the instance-type and zone labels: every character outside `[A-Za-z0-9-_.]` becomes `_`,
/// then `-`, `_` and `.` are trimmed from both ends, then the result is cut to 63 characters and
/// trimmed again. (Older CCM releases instead deleted invalid characters, dots and dashes
/// included; the current behaviour is the one implemented.)
pub fn sanitize_label_value(s: &str) -> String {
    let is_trim = |c: char| matches!(c, '-' | '_' | '.');
    let mapped: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || is_trim(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let trimmed = mapped.trim_matches(is_trim);
    if trimmed.len() > 63 {
        // Only ASCII remains, so byte 63 is a character boundary.
        trimmed[..63].trim_matches(is_trim).to_string()
    } else {
        trimmed.to_string()
    }
}

/// Parses a taint written as `key=value:Effect` or `key:Effect` (the `kubectl taint` form).
pub fn parse_taint(s: &str) -> Result<TaintSpec, TemplateError> {
    let err = |reason: String| TemplateError::InvalidTaint {
        input: s.to_string(),
        reason,
    };
    let (kv, effect) = s
        .rsplit_once(':')
        .ok_or_else(|| err("missing ':Effect' (expected key=value:Effect or key:Effect)".into()))?;
    let effect = TaintEffect::parse(effect).ok_or_else(|| {
        err(format!(
            "unknown effect '{effect}'; expected NoSchedule, PreferNoSchedule or NoExecute"
        ))
    })?;
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, v),
        None => (kv, ""),
    };
    let taint = TaintSpec {
        key: key.to_string(),
        value: value.to_string(),
        effect,
    };
    validate_taint(&taint).map_err(err)?;
    Ok(taint)
}

/// Checks a label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters of `[A-Za-z0-9-_.]` starting and ending with an alphanumeric.
pub fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !is_dns_subdomain(prefix)
    {
        return Err(format!(
            "key prefix '{prefix}' must be a lower-case DNS subdomain of at most 253 characters"
        ));
    }
    if name.is_empty() {
        return Err("key name is empty".into());
    }
    if !is_label_token(name) {
        return Err(format!(
            "key name '{name}' must be at most 63 characters of [A-Za-z0-9-_.], starting and \
             ending with a letter or digit"
        ));
    }
    Ok(())
}

/// Checks a label value: empty, or at most 63 characters of `[A-Za-z0-9-_.]` starting and
/// ending with an alphanumeric.
pub fn validate_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_label_token(value) {
        Ok(())
    } else {
        Err(format!(
            "value '{value}' must be empty or at most 63 characters of [A-Za-z0-9-_.], starting \
             and ending with a letter or digit"
        ))
    }
}

/// Reads GPU information from a CloudStack service offering.
///
/// CloudStack 4.21 and later report `gpucount`, `gpucardname` and `vgpuprofilename` on the
/// offering (pass them here); older releases keep GPU offerings in `serviceofferingdetails`
/// under `pciDevice` (the GPU group, e.g. "Group of NVIDIA A6000 GPUs") and `vgpuType` (a vGPU
/// type such as "GRID K120Q", or "passthrough"), one device per VM. A `gpucount` of 0 means the
/// newer fields say "no GPU"; the older details are still consulted.
///
/// The type is the vGPU profile when one is used (that is what the VM sees), else the card or
/// group name. The resource is `amd.com/gpu` or `gpu.intel.com/i915` when the name says AMD or
/// Intel, else `nvidia.com/gpu`.
pub fn gpu_from_offering(
    details: &BTreeMap<String, String>,
    gpucount: Option<u64>,
    gpucardname: Option<&str>,
    vgpuprofile: Option<&str>,
) -> Option<GpuSpec> {
    fn non_empty(s: Option<&str>) -> Option<&str> {
        s.map(str::trim).filter(|s| !s.is_empty())
    }
    let not_passthrough = |s: Option<&str>| {
        s.filter(|s| !s.eq_ignore_ascii_case("passthrough"))
            .map(str::to_string)
    };
    let detail = |key: &str| {
        details
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
    };

    let card = non_empty(gpucardname);
    let profile = non_empty(vgpuprofile);
    let newer = match gpucount {
        Some(0) => None,
        Some(n) => Some(n),
        None if card.is_some() || profile.is_some() => Some(1),
        None => None,
    };
    let (count, gpu_type) = if let Some(count) = newer {
        let gpu_type = not_passthrough(profile)
            .or_else(|| card.map(str::to_string))
            .unwrap_or_else(|| "gpu".to_string());
        (count, gpu_type)
    } else {
        let group = detail("pciDevice");
        let vgpu = detail("vgpuType");
        if group.is_none() && vgpu.is_none() {
            return None;
        }
        let gpu_type = not_passthrough(vgpu)
            .or_else(|| group.map(str::to_string))
            .unwrap_or_else(|| "gpu".to_string());
        (1, gpu_type)
    };

    let names = format!("{} {}", gpu_type, card.unwrap_or("")).to_ascii_lowercase();
    let resource_name =
        if names.contains("amd") || names.contains("radeon") || names.contains("instinct") {
            "amd.com/gpu"
        } else if names.contains("intel") {
            "gpu.intel.com/i915"
        } else {
            DEFAULT_GPU_RESOURCE
        };
    Some(GpuSpec {
        resource_name: resource_name.to_string(),
        count,
        gpu_type,
    })
}

/// Kubernetes' name for a CloudStack architecture (`arch` of a VM or template, CloudStack
/// 4.20.1+): `x86_64` → `amd64`, `aarch64` → `arm64`; absent or empty → `amd64` (older
/// CloudStack knows only x86); anything else lower-cased as is.
pub fn kubernetes_arch(cloudstack_arch: Option<&str>) -> String {
    match cloudstack_arch.map(str::trim).unwrap_or("") {
        "" => "amd64".to_string(),
        a if a.eq_ignore_ascii_case("x86_64") || a.eq_ignore_ascii_case("amd64") => {
            "amd64".to_string()
        }
        a if a.eq_ignore_ascii_case("aarch64") || a.eq_ignore_ascii_case("arm64") => {
            "arm64".to_string()
        }
        a => a.to_ascii_lowercase(),
    }
}

/// Canonical text of a decimal-SI quantity given in thousandths (`1500` → `1500m`, `4000` →
/// `4`, `110000` → `110`, `1000000` → `1k`), as Go's `Quantity.String()` writes it.
pub fn decimal_quantity_from_millis(millis: u64) -> String {
    const SUFFIXES: [&str; 8] = ["m", "", "k", "M", "G", "T", "P", "E"];
    if millis == 0 {
        return "0".to_string();
    }
    let (mut v, mut i) = (millis, 0);
    while i + 1 < SUFFIXES.len() && v % 1000 == 0 {
        v /= 1000;
        i += 1;
    }
    format!("{v}{}", SUFFIXES[i])
}

/// Canonical text of a binary-SI quantity given in bytes (`4294967296` → `4Gi`, `1536` →
/// `1536`), as Go's `Quantity.String()` writes it (values below 1024 use decimal form).
pub fn binary_quantity_from_bytes(bytes: u64) -> String {
    const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes < 1024 {
        return decimal_quantity_from_millis(bytes * 1000);
    }
    let (mut v, mut i) = (bytes, 0);
    while i + 1 < SUFFIXES.len() && v % 1024 == 0 {
        v /= 1024;
        i += 1;
    }
    format!("{v}{}", SUFFIXES[i])
}

fn quantity(s: String) -> Quantity {
    Quantity { string: Some(s) }
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

fn validate_taint(t: &TaintSpec) -> Result<(), String> {
    if t.key.is_empty() {
        return Err("key is empty".into());
    }
    validate_label_key(&t.key)?;
    validate_label_value(&t.value)
}

fn validate_taints(taints: &[TaintSpec]) -> Result<(), TemplateError> {
    for (i, t) in taints.iter().enumerate() {
        let input = format!("{}={}:{}", t.key, t.value, t.effect.as_str());
        validate_taint(t).map_err(|reason| TemplateError::InvalidTaint {
            input: input.clone(),
            reason,
        })?;
        if taints[..i]
            .iter()
            .any(|o| o.key == t.key && o.effect == t.effect)
        {
            return Err(TemplateError::InvalidTaint {
                input,
                reason: "another taint has the same key and effect (Kubernetes rejects that)"
                    .into(),
            });
        }
    }
    Ok(())
}

fn is_label_token(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            let lower_alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
            !b.is_empty()
                && lower_alnum(&b[0])
                && lower_alnum(&b[b.len() - 1])
                && b.iter().all(|c| lower_alnum(c) || *c == b'-')
        })
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
