//! What every parser must do with any input: never panic, name the input in its errors, and
//! keep the invariants of what it accepts.
//!
//! Shared by the cargo-fuzz targets and the property tests in `tests/it/prop_parsers.rs`
//! (included there by path). Every broken invariant panics with the input that broke it.

use cks_autoscaler_provider::config::{
    CloudConfig, ClusterRef, MAX_NODES_LIMIT, parse_cloud_config, parse_nodes_spec,
};
use cks_cloudstack::types::{
    AsyncJob, ClusterVm, JobOutcome, KubernetesCluster, ListedJob, ServiceOffering,
};
use cks_domain::nodeid::{default_provider_id, vm_id_from_provider_id};
use serde::Deserialize;

/// Parses `text` as a cloud-config named `source_name`. A refusal names `source_name`; an
/// accepted config has an http(s) URL with a host, non-empty keys, and a `Debug` form
/// that shows nothing of the secret key and no more than four characters of the API key.
pub fn check_cloud_config(text: &str, source_name: &str) -> Option<CloudConfig> {
    match parse_cloud_config(text, source_name) {
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.contains(source_name),
                "error does not name {source_name:?}: {message}"
            );
            None
        }
        Ok(config) => {
            let url = url::Url::parse(&config.api_url)
                .unwrap_or_else(|e| panic!("accepted api-url {:?}: {e}", config.api_url));
            assert!(
                matches!(url.scheme(), "http" | "https") && url.host_str().is_some(),
                "accepted api-url {:?}",
                config.api_url
            );
            for (key, value) in [
                ("api-key", &config.api_key),
                ("secret-key", &config.secret_key),
            ] {
                assert!(!value.is_empty(), "accepted an empty {key}");
            }
            for value in [&config.project_id, &config.zone].into_iter().flatten() {
                assert!(!value.is_empty(), "an empty optional value is None");
            }
            let shown = format!("{config:?}");
            let other_secret = CloudConfig {
                secret_key: format!("{}x", config.secret_key),
                ..config.clone()
            };
            assert_eq!(
                shown,
                format!("{other_secret:?}"),
                "Debug depends on the secret key"
            );
            if config.api_key.chars().count() >= 4 {
                let head: String = config.api_key.chars().take(4).collect();
                let other_key = CloudConfig {
                    api_key: format!("{head}{}", "z".repeat(config.api_key.len() + 1)),
                    ..config.clone()
                };
                assert_eq!(
                    shown,
                    format!("{other_key:?}"),
                    "Debug shows more than 4 characters of the API key"
                );
            }
            Some(config)
        }
    }
}

/// Parses `spec` as a `--nodes` value. A refusal quotes the input; an accepted spec has
/// MIN ≤ MAX ≤ the limit and a non-empty, trimmed cluster reference, and prints back
/// (`MIN:MAX:id=…` / `MIN:MAX:name=…`) to a spec that parses to the same value.
pub fn check_nodes_spec(spec: &str) {
    match parse_nodes_spec(spec) {
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.contains(&format!("{spec:?}")),
                "error does not quote {spec:?}: {message}"
            );
        }
        Ok(group) => {
            assert!(
                group.min <= group.max && group.max <= MAX_NODES_LIMIT,
                "accepted {spec:?} as {group:?}"
            );
            let (ClusterRef::Id(v) | ClusterRef::Name(v)) = &group.cluster;
            assert!(
                !v.is_empty() && v.trim() == v && !v.contains(':'),
                "accepted {spec:?} as {group:?}"
            );
            let printed = format!("{}:{}:{}", group.min, group.max, group.cluster);
            let again = parse_nodes_spec(&printed)
                .unwrap_or_else(|e| panic!("{spec:?} printed as {printed:?}: {e}"));
            assert_eq!(again, group, "{spec:?} printed as {printed:?}");
        }
    }
}

/// A providerID names the part after the first `://` (or the whole string), never an empty
/// id, and the default providerID of any non-empty id names that id.
pub fn check_provider_id(s: &str) {
    let after_scheme = s.split_once("://").map_or(s, |(_, id)| id);
    match vm_id_from_provider_id(s) {
        None => assert!(after_scheme.is_empty(), "{s:?} names no VM"),
        Some(id) => {
            assert_eq!(id, after_scheme, "{s:?}");
            assert!(!id.is_empty() && s.ends_with(id), "{s:?} -> {id:?}");
        }
    }
    if !s.is_empty() {
        let provider_id = default_provider_id(s);
        assert_eq!(
            vm_id_from_provider_id(&provider_id),
            Some(s),
            "{provider_id:?} does not name {s:?}"
        );
    }
}

/// Feeds `bytes` to every CloudStack response type the client reads, both directly and the way
/// the client does (a `serde_json::Value` first, then each list item), and checks job outcomes
/// with [`check_job_outcome`]. Never panics on any input.
pub fn check_cloudstack_json(bytes: &[u8]) {
    parse_all(bytes);
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) else {
        return;
    };
    // The client unwraps `<command>response`, then reads a list field or the object itself.
    let mut objects = vec![&value];
    if let Some(obj) = value.as_object() {
        for inner in obj.values() {
            objects.push(inner);
            if let Some(inner) = inner.as_object() {
                for field in inner.values() {
                    objects.push(field);
                    if let Some(items) = field.as_array() {
                        objects.extend(items.iter());
                    }
                }
            }
        }
    }
    for v in objects {
        from_value(v);
    }
}

fn parse_all(bytes: &[u8]) {
    let _ = serde_json::from_slice::<KubernetesCluster>(bytes);
    let _ = serde_json::from_slice::<Vec<KubernetesCluster>>(bytes);
    let _ = serde_json::from_slice::<ClusterVm>(bytes);
    let _ = serde_json::from_slice::<ServiceOffering>(bytes);
    let _ = serde_json::from_slice::<ListedJob>(bytes);
    if let Ok(job) = serde_json::from_slice::<AsyncJob>(bytes) {
        check_job_outcome(&job);
    }
}

fn from_value(v: &serde_json::Value) {
    let _ = KubernetesCluster::deserialize(v);
    let _ = ServiceOffering::deserialize(v);
    let _ = ListedJob::deserialize(v);
    if let Ok(job) = AsyncJob::deserialize(v) {
        check_job_outcome(&job);
    }
}

/// An integer CloudStack may send as a number or a numeric string.
fn lenient_i64(v: &serde_json::Value) -> Option<i64> {
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
}

/// `AsyncJob::outcome` as CloudStack defines `jobstatus`: 0 pending, 1 succeeded (with the
/// readable `jobresult.kubernetescluster`), 2 failed, 3 cancelled, anything else a failure that
/// names the job and the status. A failure's code is `jobresult.errorcode` when readable, else
/// `jobresultcode`; its text is never blank and is CloudStack's own when it sent one.
pub fn check_job_outcome(job: &AsyncJob) -> JobOutcome {
    let outcome = job.outcome();
    let result = job.jobresult.as_ref();
    match (job.jobstatus, &outcome) {
        (0, JobOutcome::Pending) | (3, JobOutcome::Cancelled) => {}
        (1, JobOutcome::Succeeded(cluster)) => {
            let readable = result
                .and_then(|r| r.get("kubernetescluster"))
                .and_then(|c| KubernetesCluster::deserialize(c).ok());
            assert_eq!(
                cluster.as_deref(),
                readable.as_ref(),
                "result cluster of {job:?}"
            );
        }
        (
            status,
            JobOutcome::Failed {
                errorcode,
                errortext,
            },
        ) if !matches!(status, 0 | 1 | 3) => {
            let expected_code = result
                .and_then(|r| r.get("errorcode"))
                .and_then(lenient_i64)
                .unwrap_or(job.jobresultcode);
            assert_eq!(*errorcode, expected_code, "error code of {job:?}");
            assert!(!errortext.trim().is_empty(), "blank error text for {job:?}");
            let cloudstack_text = match result {
                Some(serde_json::Value::String(s)) => Some(s.as_str()),
                Some(r) => r.get("errortext").and_then(|t| t.as_str()),
                None => None,
            }
            .filter(|t| !t.trim().is_empty());
            if let Some(text) = cloudstack_text {
                assert!(errortext.contains(text), "{errortext:?} drops {text:?}");
            }
            if status != 2 {
                assert!(
                    errortext.contains(&job.jobid) && errortext.contains(&status.to_string()),
                    "{errortext:?} for unknown status {status}"
                );
            }
        }
        (status, other) => panic!("jobstatus {status} gave {other:?}: {job:?}"),
    }
    outcome
}
