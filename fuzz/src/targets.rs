//! Each fuzz target's body, from the bytes libFuzzer hands it: the `fuzz_targets/` binaries
//! call these, and so does the stable replay test (`tests/replay.rs`), which runs them on
//! seeded inputs in every `cargo test`.
//!
//! Each returns a label for what the input turned out to be (accepted, refused, which rule,
//! not decodable), so the replay can require that its inputs reach both sides of every check.
//! Every broken invariant panics.

use crate::{decision, input::ScaleCase, parsers};
use arbitrary::{Arbitrary, Unstructured};

/// A target: its name (as in `Cargo.toml` and `fuzz_targets/`) and its body.
pub type Target = (&'static str, fn(&[u8]) -> &'static str);

/// Every fuzz target.
pub const ALL: [Target; 5] = [
    ("cloudstack_json", cloudstack_json),
    ("cloud_config", cloud_config),
    ("nodes_spec", nodes_spec),
    ("provider_id", provider_id),
    ("scale_decision", scale_decision),
];

/// Bytes as a CloudStack response body: every response type, the way the client reads them,
/// and job outcomes. `json` when the bytes are a JSON value, else `not-json`.
pub fn cloudstack_json(data: &[u8]) -> &'static str {
    parsers::check_cloudstack_json(data);
    match serde_json::from_slice::<serde_json::Value>(data) {
        Ok(_) => "json",
        Err(_) => "not-json",
    }
}

/// Bytes (lossy UTF-8) as a cloud-config file: `accepted` or `refused`.
pub fn cloud_config(data: &[u8]) -> &'static str {
    let text = String::from_utf8_lossy(data);
    match parsers::check_cloud_config(&text, "fuzz.conf") {
        Some(_) => "accepted",
        None => "refused",
    }
}

/// A string as a `--nodes MIN:MAX:CLUSTER` value: `accepted` or `refused`.
pub fn nodes_spec(data: &[u8]) -> &'static str {
    let Some(spec) = text(data) else {
        return "undecodable";
    };
    parsers::check_nodes_spec(spec);
    match cks_autoscaler_provider::config::parse_nodes_spec(spec) {
        Ok(_) => "accepted",
        Err(_) => "refused",
    }
}

/// A string as a Kubernetes node's providerID: `names-a-vm` or `names-none`.
pub fn provider_id(data: &[u8]) -> &'static str {
    let Some(id) = text(data) else {
        return "undecodable";
    };
    parsers::check_provider_id(id);
    match cks_domain::nodeid::vm_id_from_provider_id(id) {
        Some(_) => "names-a-vm",
        None => "names-none",
    }
}

/// A cluster, a scale request and the Alert capability decoded from the bytes, through the
/// classification and `check_scale`, every invariant of [`decision`] asserted: `ok`, the
/// refusal's rule, or `undecodable`.
pub fn scale_decision(data: &[u8]) -> &'static str {
    let Ok(case) = ScaleCase::arbitrary_take_rest(Unstructured::new(data)) else {
        return "undecodable";
    };
    let (input, request, alert) = case.build();
    match decision::check_decision(&input, &request, &alert) {
        Ok(()) => "ok",
        Err(refusal) => refusal.rule(),
    }
}

/// The bytes as a string the way a `&str` fuzz target receives them (`Arbitrary`'s
/// `arbitrary_take_rest`: the valid UTF-8 prefix).
fn text(data: &[u8]) -> Option<&str> {
    <&str>::arbitrary_take_rest(Unstructured::new(data)).ok()
}
