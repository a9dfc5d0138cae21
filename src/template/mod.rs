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
//!
//! The parts follow what each answers to: `node` builds the Node from the offering and the
//! settings (the kubelet's arithmetic, the cloud-controller-manager's labels); `labels` holds
//! Kubernetes' rules for label and taint text, which also check the operator's flags before any
//! template is built; `encoding` the bytes and the quantity spelling Go's code reads back;
//! `offering` the reading of CloudStack's offering and architecture fields, which change with
//! CloudStack releases while the Node does not.

use std::collections::BTreeMap;

mod encoding;
mod labels;
mod node;
mod offering;

pub use encoding::{binary_quantity_from_bytes, decimal_quantity_from_millis, encode_node};
pub use labels::{parse_taint, sanitize_label_value, validate_label_key, validate_label_value};
pub use node::{build_template_node, template_node_name};
pub use offering::{gpu_from_offering, kubernetes_arch};

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

#[cfg(test)]
mod tests;
