//! The mock autoscaler's scheduling model: what pending pods ask for, what a node (or a node
//! group's template) offers, whether a pod fits, and how many template nodes a set of pods
//! needs.
//!
//! It is the part of the scheduler the autoscaler simulates that a cloud provider influences:
//! resource requests against `status.allocatable` (cpu, memory, pods), `nodeSelector` against
//! labels, tolerations against `NoSchedule`/`NoExecute` taints. Affinity, topology spread,
//! DaemonSet pods and extended resources are not modelled.
//!
//! A node template comes, as in the real autoscaler, from a Ready node of the group, from the
//! template cached when the group last had one, from `NodeGroupTemplateNodeInfo` (a
//! Kubernetes-protobuf `v1.Node`, decoded with k8s-pb), or as a last resort from a NotReady
//! node of the group.

use std::collections::BTreeMap;
use std::fmt;

use k8s_pb::api::core::v1::Node;
use prost::Message;

/// Taint effects that keep a pod off a node unless it tolerates them.
const BLOCKING_EFFECTS: [&str; 2] = ["NoSchedule", "NoExecute"];

/// cpu, memory and pod slots: a node's allocatable or what pods request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Resources {
    /// CPU in millicores.
    pub cpu_millis: u64,
    /// Memory in bytes.
    pub memory_bytes: u64,
    /// Pod slots.
    pub pods: u64,
}

impl Resources {
    /// No limit at all: the allocatable of a node whose source does not report one (a
    /// [`StaticNodeSource`](super::StaticNodeSource) node built without
    /// [`KubeNode::with_allocatable`](super::KubeNode::with_allocatable)).
    pub const UNBOUNDED: Resources = Resources {
        cpu_millis: u64::MAX,
        memory_bytes: u64::MAX,
        pods: u64::MAX,
    };

    /// `cpu_millis` millicores, `memory_bytes` bytes and `pods` pod slots.
    pub fn new(cpu_millis: u64, memory_bytes: u64, pods: u64) -> Self {
        Self {
            cpu_millis,
            memory_bytes,
            pods,
        }
    }

    /// Parses Kubernetes quantities (`"2"`, `"1500m"`, `"3996Mi"`, `"110"`).
    pub fn from_quantities(cpu: &str, memory: &str, pods: &str) -> Result<Self, String> {
        Ok(Self {
            cpu_millis: quantity_ceil(cpu, 1000).map_err(|e| format!("cpu {cpu:?}: {e}"))?,
            memory_bytes: quantity_ceil(memory, 1)
                .map_err(|e| format!("memory {memory:?}: {e}"))?,
            pods: quantity_ceil(pods, 1).map_err(|e| format!("pods {pods:?}: {e}"))?,
        })
    }

    fn saturating_sub(self, o: Self) -> Self {
        Self {
            cpu_millis: self.cpu_millis.saturating_sub(o.cpu_millis),
            memory_bytes: self.memory_bytes.saturating_sub(o.memory_bytes),
            pods: self.pods.saturating_sub(o.pods),
        }
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Self::UNBOUNDED {
            return f.write_str("unbounded");
        }
        write!(
            f,
            "cpu {}, memory {}, pods {}",
            cpu_text(self.cpu_millis),
            memory_text(self.memory_bytes),
            self.pods
        )
    }
}

/// A node taint.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeTaint {
    /// Taint key.
    pub key: String,
    /// Taint value (may be empty).
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

impl NodeTaint {
    /// `key=value:effect`.
    pub fn new(
        key: impl Into<String>,
        value: impl Into<String>,
        effect: impl Into<String>,
    ) -> Self {
        Self {
            key: key.into(),
            value: value.into(),
            effect: effect.into(),
        }
    }
}

impl fmt::Display for NodeTaint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}:{}", self.key, self.effect)
        } else {
            write!(f, "{}={}:{}", self.key, self.value, self.effect)
        }
    }
}

/// A pod toleration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Toleration {
    /// Taint key; empty with `value` `None` tolerates every taint.
    pub key: String,
    /// `Some(v)`: operator `Equal` with value `v`; `None`: operator `Exists`.
    pub value: Option<String>,
    /// Effect tolerated; `None` tolerates every effect.
    pub effect: Option<String>,
}

impl Toleration {
    /// Tolerates any taint with this key (operator `Exists`, any effect).
    pub fn exists(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            value: None,
            effect: None,
        }
    }

    /// Tolerates `key=value` with `effect` (operator `Equal`).
    pub fn equal(
        key: impl Into<String>,
        value: impl Into<String>,
        effect: impl Into<String>,
    ) -> Self {
        Self {
            key: key.into(),
            value: Some(value.into()),
            effect: Some(effect.into()),
        }
    }

    fn tolerates(&self, t: &NodeTaint) -> bool {
        if self.effect.as_ref().is_some_and(|e| *e != t.effect) {
            return false;
        }
        match &self.value {
            None => self.key.is_empty() || self.key == t.key,
            Some(v) => self.key == t.key && *v == t.value,
        }
    }
}

/// A pending pod as the mock models it: requests, node selector, tolerations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSpec {
    /// Pod name (for the timeline).
    pub name: String,
    /// CPU request in millicores.
    pub cpu_millis: u64,
    /// Memory request in bytes.
    pub memory_bytes: u64,
    /// `spec.nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// `spec.tolerations`.
    pub tolerations: Vec<Toleration>,
}

impl PodSpec {
    /// A pod requesting `cpu_millis` millicores and `memory_bytes` bytes, with no selector or
    /// toleration.
    pub fn new(name: impl Into<String>, cpu_millis: u64, memory_bytes: u64) -> Self {
        Self {
            name: name.into(),
            cpu_millis,
            memory_bytes,
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
        }
    }

    /// `n` pods `prefix-1`..`prefix-n` with the same requests.
    pub fn replicas(prefix: &str, n: usize, cpu_millis: u64, memory_bytes: u64) -> Vec<Self> {
        (1..=n)
            .map(|i| Self::new(format!("{prefix}-{i}"), cpu_millis, memory_bytes))
            .collect()
    }

    /// The same pod selecting nodes labelled `key=value`.
    #[must_use]
    pub fn with_node_selector(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.node_selector.insert(key.into(), value.into());
        self
    }

    /// The same pod with one more toleration.
    #[must_use]
    pub fn tolerating(mut self, toleration: Toleration) -> Self {
        self.tolerations.push(toleration);
        self
    }

    /// What the pod takes from a node: its requests and one pod slot.
    pub fn requests(&self) -> Resources {
        Resources::new(self.cpu_millis, self.memory_bytes, 1)
    }
}

impl fmt::Display for PodSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (cpu {}, memory {})",
            self.name,
            cpu_text(self.cpu_millis),
            memory_text(self.memory_bytes)
        )
    }
}

/// Why a pod does not fit a node with `free` resources left, `labels` and `taints`; `Ok` if
/// it fits. Every failed check is named.
pub fn check_fit(
    pod: &PodSpec,
    free: &Resources,
    labels: &BTreeMap<String, String>,
    taints: &[NodeTaint],
) -> Result<(), String> {
    let mut why = Vec::new();
    for (k, v) in &pod.node_selector {
        match labels.get(k) {
            Some(l) if l == v => {}
            Some(l) => why.push(format!("node selector {k}={v} but the label is {k}={l}")),
            None => why.push(format!("node selector {k}={v} but there is no label {k}")),
        }
    }
    for t in taints
        .iter()
        .filter(|t| BLOCKING_EFFECTS.contains(&t.effect.as_str()))
    {
        if !pod.tolerations.iter().any(|tol| tol.tolerates(t)) {
            why.push(format!("taint {t} not tolerated"));
        }
    }
    if pod.cpu_millis > free.cpu_millis {
        why.push(format!(
            "cpu {} > allocatable {}",
            cpu_text(pod.cpu_millis),
            cpu_text(free.cpu_millis)
        ));
    }
    if pod.memory_bytes > free.memory_bytes {
        why.push(format!(
            "memory {} > allocatable {}",
            memory_text(pod.memory_bytes),
            memory_text(free.memory_bytes)
        ));
    }
    if free.pods == 0 {
        why.push("no pod slot left (allocatable pods 0)".to_owned());
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(why.join("; "))
    }
}

/// Places `pod` on the first node of `free` it fits (same labels and taints for all), taking
/// its requests from that node. False if it fits none.
pub(crate) fn place(
    pod: &PodSpec,
    free: &mut [Resources],
    labels: &BTreeMap<String, String>,
    taints: &[NodeTaint],
) -> bool {
    for node in free.iter_mut() {
        if check_fit(pod, node, labels, taints).is_ok() {
            *node = node.saturating_sub(pod.requests());
            return true;
        }
    }
    false
}

/// Where a node group's template came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateSource {
    /// A Ready node of the group, this loop.
    ReadyNode(String),
    /// The template built from this Ready node when the group last had one (the real
    /// autoscaler keeps it until it restarts).
    Cached(String),
    /// `NodeGroupTemplateNodeInfo`.
    Provider,
    /// Last resort: this NotReady node of the group.
    UnreadyNode(String),
}

impl fmt::Display for TemplateSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TemplateSource::ReadyNode(n) => write!(f, "Ready node {n}"),
            TemplateSource::Cached(n) => write!(f, "cached from node {n}"),
            TemplateSource::Provider => f.write_str("NodeGroupTemplateNodeInfo"),
            TemplateSource::UnreadyNode(n) => write!(f, "NotReady node {n}"),
        }
    }
}

/// What a new node of a group would offer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTemplate {
    /// Where it came from.
    pub source: TemplateSource,
    /// `status.allocatable` (cpu, memory, pods).
    pub allocatable: Resources,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `spec.taints`, without the ones the autoscaler strips from templates.
    pub taints: Vec<NodeTaint>,
}

impl NodeTemplate {
    /// The template a node of the group gives: its allocatable ([`Resources::UNBOUNDED`]
    /// when the source reports none), labels and taints.
    pub fn from_node(node: &super::KubeNode, source: TemplateSource) -> Self {
        Self {
            source,
            allocatable: node.allocatable.unwrap_or(Resources::UNBOUNDED),
            labels: node.labels.clone(),
            taints: sanitize_taints(&node.taints),
        }
    }

    /// Decodes a `NodeGroupTemplateNodeInfo` answer: `nodeBytes` is a Kubernetes-protobuf
    /// `v1.Node`. Only `status.allocatable` counts, as for the scheduler: a resource missing
    /// there is 0, so nothing needing it fits.
    pub fn decode(node_bytes: &[u8]) -> Result<Self, String> {
        if node_bytes.is_empty() {
            // The real client turns this into a nil node the core then dereferences.
            return Err("nodeBytes is empty".to_owned());
        }
        let node = Node::decode(node_bytes)
            .map_err(|e| format!("nodeBytes is not a Kubernetes-protobuf v1.Node: {e}"))?;
        let labels = node.metadata.map(|m| m.labels).unwrap_or_default();
        let taints: Vec<NodeTaint> = node
            .spec
            .map(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .map(|t| NodeTaint {
                key: t.key.unwrap_or_default(),
                value: t.value.unwrap_or_default(),
                effect: t.effect.unwrap_or_default(),
            })
            .collect();
        let allocatable = node.status.map(|s| s.allocatable).unwrap_or_default();
        let amount = |name: &str, scale: u128| -> Result<u64, String> {
            match allocatable.get(name).and_then(|q| q.string.as_deref()) {
                None => Ok(0),
                Some(q) => {
                    quantity_ceil(q, scale).map_err(|e| format!("allocatable {name} {q:?}: {e}"))
                }
            }
        };
        Ok(Self {
            source: TemplateSource::Provider,
            allocatable: Resources {
                cpu_millis: amount("cpu", 1000)?,
                memory_bytes: amount("memory", 1)?,
                pods: amount("pods", 1)?,
            },
            labels,
            taints: sanitize_taints(&taints),
        })
    }

    /// Why `pod` does not fit an empty node of this template, or `Ok`.
    pub fn check(&self, pod: &PodSpec) -> Result<(), String> {
        check_fit(pod, &self.allocatable, &self.labels, &self.taints)
    }

    /// Places `pods` first-fit on new nodes of this template, biggest first, and returns how
    /// many nodes that takes. Pods that do not fit an empty node are left out.
    pub fn nodes_needed(&self, pods: &[&PodSpec]) -> usize {
        let mut sorted: Vec<&PodSpec> = pods
            .iter()
            .copied()
            .filter(|p| self.check(p).is_ok())
            .collect();
        sorted.sort_by_key(|p| std::cmp::Reverse((p.cpu_millis, p.memory_bytes)));
        let mut nodes: Vec<Resources> = Vec::new();
        for pod in sorted {
            if !place(pod, &mut nodes, &self.labels, &self.taints) {
                nodes.push(self.allocatable.saturating_sub(pod.requests()));
            }
        }
        nodes.len()
    }
}

impl fmt::Display for NodeTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "from {}: allocatable {}, {} label(s)",
            self.source,
            self.allocatable,
            self.labels.len()
        )?;
        if !self.taints.is_empty() {
            let t: Vec<String> = self.taints.iter().map(ToString::to_string).collect();
            write!(f, ", taints {}", t.join(", "))?;
        }
        Ok(())
    }
}

/// The autoscaler drops the taints that describe one node's transient state (its deletion,
/// its conditions, its start-up) before it uses the node as a template.
fn sanitize_taints(taints: &[NodeTaint]) -> Vec<NodeTaint> {
    taints
        .iter()
        .filter(|t| {
            !matches!(
                t.key.as_str(),
                "ToBeDeletedByClusterAutoscaler"
                    | "DeletionCandidateOfClusterAutoscaler"
                    | "node.cloudprovider.kubernetes.io/uninitialized"
                    | "node.cloudprovider.kubernetes.io/shutdown"
            ) && !t.key.starts_with("node.kubernetes.io/")
        })
        .cloned()
        .collect()
}

/// A Kubernetes quantity times `scale`, rounded up (`scale` 1000 gives millis). Accepts the
/// forms `Quantity.String()` writes and the ones users write: a decimal number with an
/// optional SI suffix (`m`, `k`, `M`, `G`, `T`, `P`, `E`), binary suffix (`Ki` … `Ei`) or
/// decimal exponent (`e3`, `E-3`).
pub fn quantity_ceil(q: &str, scale: u128) -> Result<u64, String> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let number = number.strip_prefix('+').unwrap_or(number);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty() {
        return Err("no number".to_owned());
    }
    let digits = format!("{int}{frac}");
    if digits.len() > 30 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err("not a decimal number".to_owned());
    }
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits
            .parse()
            .map_err(|_| "not a decimal number".to_owned())?
    };
    let frac_digits = u32::try_from(frac.len()).map_err(|_| "too many digits".to_owned())?;
    let mut num = mantissa;
    let mut den = pow10(frac_digits)?;
    let (mul, div): (u128, u128) = match suffix {
        "" => (1, 1),
        "m" => (1, 1000),
        "k" => (1000, 1),
        "M" => (pow10(6)?, 1),
        "G" => (pow10(9)?, 1),
        "T" => (pow10(12)?, 1),
        "P" => (pow10(15)?, 1),
        "E" => (pow10(18)?, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        s if s.starts_with(['e', 'E']) => {
            let exp: i32 = s[1..]
                .parse()
                .map_err(|_| format!("unknown suffix {s:?}"))?;
            let p = pow10(exp.unsigned_abs())?;
            if exp >= 0 { (p, 1) } else { (1, p) }
        }
        s => return Err(format!("unknown suffix {s:?}")),
    };
    let too_large = || "too large".to_owned();
    num = num
        .checked_mul(mul)
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(too_large)?;
    den = den.checked_mul(div).ok_or_else(too_large)?;
    let value = num.div_ceil(den);
    u64::try_from(value).map_err(|_| too_large())
}

fn pow10(exp: u32) -> Result<u128, String> {
    10u128
        .checked_pow(exp)
        .ok_or_else(|| format!("exponent {exp} too large"))
}

/// `1500m`, `2` (whole cores).
pub(crate) fn cpu_text(millis: u64) -> String {
    if millis == u64::MAX {
        "unbounded".to_owned()
    } else if millis.is_multiple_of(1000) {
        format!("{}", millis / 1000)
    } else {
        format!("{millis}m")
    }
}

/// `4Gi`, `3996Mi`, `1536Ki` or bytes, whichever is exact.
pub(crate) fn memory_text(bytes: u64) -> String {
    const KI: u64 = 1 << 10;
    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;
    if bytes == u64::MAX {
        "unbounded".to_owned()
    } else if bytes == 0 {
        "0".to_owned()
    } else if bytes.is_multiple_of(GI) {
        format!("{}Gi", bytes / GI)
    } else if bytes.is_multiple_of(MI) {
        format!("{}Mi", bytes / MI)
    } else if bytes.is_multiple_of(KI) {
        format!("{}Ki", bytes / KI)
    } else {
        bytes.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_pb::api::core::v1::{NodeSpec, NodeStatus, Taint};
    use k8s_pb::apimachinery::pkg::api::resource::Quantity;
    use k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;

    #[test]
    fn quantities_parse_like_kubernetes() {
        let cases: &[(&str, u128, u64)] = &[
            ("2", 1000, 2000),
            ("1500m", 1000, 1500),
            ("0.5", 1000, 500),
            ("100m", 1, 1), // a tenth rounds up
            ("3996Mi", 1, 3996 * MI),
            ("4Gi", 1, 4 * GI),
            ("1k", 1, 1000),
            ("1M", 1, 1_000_000),
            ("1e3", 1, 1000),
            ("5E-1", 1000, 500),
            ("+7", 1, 7),
            ("110", 1, 110),
            ("1.5Gi", 1, 3 * GI / 2),
        ];
        for (q, scale, want) in cases {
            assert_eq!(quantity_ceil(q, *scale), Ok(*want), "{q}");
        }
        for bad in [
            "",
            "Mi",
            "1Zi",
            "-1",
            "1.2.3",
            "1ee3",
            "99999999999999999999Ei",
        ] {
            assert!(quantity_ceil(bad, 1).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn fit_names_every_failed_check() {
        let labels = BTreeMap::from([("zone".to_owned(), "a".to_owned())]);
        let taints = vec![
            NodeTaint::new("gpu", "true", "NoSchedule"),
            NodeTaint::new("soft", "", "PreferNoSchedule"),
        ];
        let free = Resources::new(2000, 4 * GI, 110);
        let pod = PodSpec::new("p", 500, GI);
        let err = check_fit(&pod, &free, &labels, &taints).unwrap_err();
        assert_eq!(err, "taint gpu=true:NoSchedule not tolerated");
        let ok = pod.clone().tolerating(Toleration::exists("gpu"));
        assert_eq!(check_fit(&ok, &free, &labels, &taints), Ok(()));
        let eq = pod
            .clone()
            .tolerating(Toleration::equal("gpu", "true", "NoSchedule"));
        assert_eq!(check_fit(&eq, &free, &labels, &taints), Ok(()));
        let wrong = pod.tolerating(Toleration::equal("gpu", "false", "NoSchedule"));
        assert!(check_fit(&wrong, &free, &labels, &taints).is_err());

        let big = PodSpec::new("big", 3000, 8 * GI)
            .with_node_selector("zone", "b")
            .tolerating(Toleration::exists(""));
        let err = check_fit(&big, &free, &labels, &taints).unwrap_err();
        assert_eq!(
            err,
            "node selector zone=b but the label is zone=a; cpu 3 > allocatable 2; \
             memory 8Gi > allocatable 4Gi"
        );
        let none = Resources::new(2000, 4 * GI, 0);
        assert!(
            check_fit(&PodSpec::new("x", 1, 1), &none, &labels, &[])
                .unwrap_err()
                .contains("no pod slot")
        );
    }

    #[test]
    fn packing_counts_template_nodes() {
        let t = NodeTemplate {
            source: TemplateSource::Provider,
            allocatable: Resources::new(2000, 4 * GI, 3),
            labels: BTreeMap::new(),
            taints: Vec::new(),
        };
        let pods = PodSpec::replicas("web", 3, 1500, GI);
        let refs: Vec<&PodSpec> = pods.iter().collect();
        assert_eq!(t.nodes_needed(&refs), 3, "1.5 cpu each: one per 2-cpu node");
        let small = PodSpec::replicas("s", 7, 100, 100 * MI);
        let refs: Vec<&PodSpec> = small.iter().collect();
        assert_eq!(t.nodes_needed(&refs), 3, "3 pod slots per node");
        let huge = PodSpec::new("huge", 100, 5 * GI);
        assert_eq!(
            t.nodes_needed(&[&huge]),
            0,
            "a pod that fits no node needs none"
        );
    }

    fn q(s: &str) -> Quantity {
        Quantity {
            string: Some(s.to_owned()),
        }
    }

    #[test]
    fn template_bytes_decode_into_allocatable_labels_and_taints() {
        let node = Node {
            metadata: Some(ObjectMeta {
                labels: BTreeMap::from([("kubernetes.io/os".to_owned(), "linux".to_owned())]),
                ..Default::default()
            }),
            spec: Some(NodeSpec {
                taints: vec![
                    Taint {
                        key: Some("dedicated".into()),
                        value: Some("batch".into()),
                        effect: Some("NoSchedule".into()),
                        time_added: None,
                    },
                    Taint {
                        key: Some("node.kubernetes.io/not-ready".into()),
                        value: None,
                        effect: Some("NoExecute".into()),
                        time_added: None,
                    },
                ],
                ..Default::default()
            }),
            status: Some(NodeStatus {
                capacity: BTreeMap::from([("cpu".to_owned(), q("4"))]),
                allocatable: BTreeMap::from([
                    ("cpu".to_owned(), q("3500m")),
                    ("memory".to_owned(), q("3996Mi")),
                    ("pods".to_owned(), q("110")),
                ]),
                ..Default::default()
            }),
        };
        let t = NodeTemplate::decode(&node.encode_to_vec()).unwrap();
        assert_eq!(t.source, TemplateSource::Provider);
        assert_eq!(t.allocatable, Resources::new(3500, 3996 * MI, 110));
        assert_eq!(
            t.labels.get("kubernetes.io/os").map(String::as_str),
            Some("linux")
        );
        // The condition taint is one the autoscaler strips from templates.
        assert_eq!(
            t.taints,
            vec![NodeTaint::new("dedicated", "batch", "NoSchedule")]
        );
        assert_eq!(
            t.to_string(),
            "from NodeGroupTemplateNodeInfo: allocatable cpu 3500m, memory 3996Mi, pods 110, \
             1 label(s), taints dedicated=batch:NoSchedule"
        );

        // Capacity alone is not allocatable: nothing fits.
        let mut bare = node.clone();
        if let Some(s) = bare.status.as_mut() {
            s.allocatable.clear();
        }
        let t = NodeTemplate::decode(&bare.encode_to_vec()).unwrap();
        assert_eq!(t.allocatable, Resources::default());
        assert!(t.check(&PodSpec::new("p", 1, 1)).is_err());

        assert_eq!(NodeTemplate::decode(&[]).unwrap_err(), "nodeBytes is empty");
        assert!(NodeTemplate::decode(&[0xff, 0xff, 0xff]).is_err());
        let mut bad = node;
        if let Some(s) = bad.status.as_mut() {
            s.allocatable.insert("memory".into(), q("lots"));
        }
        let err = NodeTemplate::decode(&bad.encode_to_vec()).unwrap_err();
        assert!(err.contains("allocatable memory \"lots\""), "{err}");
    }
}
