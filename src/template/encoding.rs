//! How a template leaves the provider: the Node as the Kubernetes protobuf bytes Go's
//! `v1.Node.Marshal()` writes, and quantities in the canonical text Go's `Quantity.String()`
//! writes. Apart from the building so that what the autoscaler decodes is decided in one place
//! and matches Go's code, whatever the Node holds.

use k8s_pb::api::core::v1::Node;
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use prost::Message;

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

pub(super) fn quantity(s: String) -> Quantity {
    Quantity { string: Some(s) }
}
