//! The example alerts (`docs/prometheus-rules.yaml`, which the chart renders as its
//! PrometheusRule) run by Prometheus's own `promtool` (`tools/promtool/build.sh`): `check rules`
//! parses every expression as Prometheus does, and `test rules` evaluates the alerts of
//! leader election, readiness and a client in another cluster over series written here,
//! `for:` durations included, with the annotations the rules give (labels expanded as
//! Prometheus expands them). A failover within the minute raises nothing; no leader for a
//! minute does; a provider without `--leader-elect` never does; a standby that cannot read the
//! ledger (NotReady) does after ten minutes; a client judged to run in another cluster does a
//! minute on, naming it and both clusters, until the judgment ends.
//!
//! Needs `promtool`: `CKS_PROMTOOL` when given (CI), else built on first use by
//! `cks_testkit::tools`; the test fails naming what is missing when it cannot be had.

use serde_json::{Map, Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `spec.groups` of the example PrometheusRule: a plain Prometheus rule file's `groups`.
fn rule_groups() -> Value {
    let text = std::fs::read_to_string(repo().join("docs/prometheus-rules.yaml"))
        .expect("docs/prometheus-rules.yaml");
    let doc: Value = serde_saphyr::from_str(&text).expect("the example rules are YAML");
    let groups = doc.pointer("/spec/groups").cloned().expect("spec.groups");
    assert!(groups.as_array().is_some_and(|g| !g.is_empty()), "{doc}");
    groups
}

/// The rule named `alert` in `groups`.
fn rule<'a>(groups: &'a Value, alert: &str) -> &'a Value {
    groups
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .find(|r| r["alert"] == alert)
        .unwrap_or_else(|| panic!("no alert {alert} in docs/prometheus-rules.yaml"))
}

/// The alert promtool must see: the rule's labels with `labels` (the series' own), and its
/// annotations with `{{ $labels.NAME }}` expanded from them, as Prometheus's template does.
fn expected(groups: &Value, alert: &str, labels: &[(&str, &str)]) -> Value {
    let rule = rule(groups, alert);
    let mut all: Map<String, Value> = labels
        .iter()
        .map(|(k, v)| ((*k).to_string(), Value::from(*v)))
        .collect();
    if let Some(own) = rule["labels"].as_object() {
        all.extend(own.clone());
    }
    let mut annotations = Map::new();
    for (k, v) in rule["annotations"].as_object().into_iter().flatten() {
        let mut text = v.as_str().unwrap_or_default().to_string();
        for (name, value) in &all {
            let value = value.as_str().unwrap_or_default();
            text = text.replace(&format!("{{{{ $labels.{name} }}}}"), value);
        }
        assert!(
            !text.contains("{{"),
            "{alert}'s annotation {k} has a template this test does not expand: {text}"
        );
        annotations.insert(k.clone(), Value::from(text));
    }
    json!({"exp_labels": all, "exp_annotations": annotations})
}

const JOB: &str = "cks-autoscaler-provider";

fn series(name: &str, pod: &str, values: &str) -> Value {
    json!({
        "series": format!("{name}{{job=\"{JOB}\",namespace=\"kube-system\",pod=\"{pod}\"}}"),
        "values": values,
    })
}

/// One promtool test group: series every 30 s (a scrape interval), and what each alert must
/// be at each evaluation time.
fn case(name: &str, input: Vec<Value>, alerts: Vec<(&str, &str, Vec<Value>)>) -> Value {
    json!({
        "name": name,
        "interval": "30s",
        "input_series": input,
        "alert_rule_test": alerts
            .into_iter()
            .map(|(at, alert, exp)| json!({"eval_time": at, "alertname": alert, "exp_alerts": exp}))
            .collect::<Vec<_>>(),
    })
}

fn run(promtool: &Path, args: &[&str], dir: &Path) -> (bool, String) {
    let out = Command::new(promtool)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", promtool.display()));
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn prometheus_evaluates_the_leader_and_readiness_alerts_as_the_guide_says() {
    let promtool = cks_testkit::tools::promtool().unwrap_or_else(|e| panic!("{e}"));
    let groups = rule_groups();
    let dir = cks_testkit::certs::TempDir::new("alert-rules");
    dir.write(
        "rules.json",
        serde_json::to_string(&json!({"groups": groups})).expect("rules"),
    );
    let (ok, said) = run(&promtool, &["check", "rules", "rules.json"], &dir.path(""));
    assert!(
        ok,
        "promtool check rules refused the example alerts:\n{said}"
    );

    let no_leader = expected(&groups, "CksProviderNoLeader", &[]);
    let standby_not_ready = expected(
        &groups,
        "CksProviderNotReady",
        // `max by (namespace, pod)`: the job is not among them.
        &[("namespace", "kube-system"), ("pod", "provider-b")],
    );
    let unreachable = expected(
        &groups,
        "CksCloudStackUnreachable",
        &[
            ("namespace", "kube-system"),
            ("pod", "provider-a"),
            ("node_group", "c1"),
        ],
    );
    let stuck = expected(
        &groups,
        "CksProviderStuck",
        &[("namespace", "kube-system"), ("pod", "provider-a")],
    );
    let mismatch_labels = [
        ("namespace", "kube-system"),
        ("pod", "provider-a"),
        ("client", "autoscaler.south"),
        ("bound_cluster", "south"),
        ("seen_cluster", "north"),
    ];
    let mismatch = expected(&groups, "CksClientClusterMismatch", &mismatch_labels);
    let mismatch_series = |values: &str| {
        json!({
            "series": format!("cks_provider_client_cluster_mismatch{{job=\"{JOB}\",namespace=\"kube-system\",pod=\"provider-a\",client=\"autoscaler.south\",bound_cluster=\"south\",seen_cluster=\"north\"}}"),
            "values": values,
        })
    };
    let failures = |values: &str| {
        json!({
            "series": format!("cks_provider_node_group_refresh_failures{{job=\"{JOB}\",namespace=\"kube-system\",pod=\"provider-a\",node_group=\"c1\"}}"),
            "values": values,
        })
    };
    let tests = vec![
        // CloudStack restarted for 2 minutes (failures climb, then 0): nothing; down from 1m
        // for good: the third failure in a row at 2m, firing 5 minutes later.
        case(
            "a CloudStack restart within minutes",
            vec![failures("0 0 1 2 3 4 5 6 0x20")],
            vec![("10m", "CksCloudStackUnreachable", vec![])],
        ),
        case(
            "CloudStack down for good",
            vec![failures("0 0 1 2 3+1x30")],
            vec![
                ("6m30s", "CksCloudStackUnreachable", vec![]),
                ("7m30s", "CksCloudStackUnreachable", vec![unreachable]),
                ("7m30s", "CksProviderStuck", vec![]),
            ],
        ),
        // A stuck provider is restarted by its liveness probe within a minute: one scrape saw
        // it stuck, which raises the alert for 15 minutes after; CloudStack down never does.
        case(
            "a provider stuck in itself, restarted",
            vec![series(
                "cks_provider_stalled",
                "provider-a",
                "0 0 1 1 stale 0x30",
            )],
            vec![
                ("30s", "CksProviderStuck", vec![]),
                ("5m", "CksProviderStuck", vec![stuck.clone()]),
                ("18m", "CksProviderStuck", vec![]),
            ],
        ),
        // North's autoscaler judged to hold south's certificate from 1m to 6m: firing a minute
        // on, naming the client and both clusters, and no more once the judgment ended.
        case(
            "an autoscaler holding another cluster's client certificate",
            vec![mismatch_series("0 0 1x10 0x10")],
            vec![
                ("1m30s", "CksClientClusterMismatch", vec![]),
                ("2m30s", "CksClientClusterMismatch", vec![mismatch]),
                ("7m", "CksClientClusterMismatch", vec![]),
            ],
        ),
        // The leader killed at 2m30s (its target gone: a staleness marker), the standby
        // leading from 3m: 30 s without a leader, inside the alert's minute.
        case(
            "failover within the minute",
            vec![
                series("cks_provider_leader", "provider-a", "1x4 stale"),
                series("cks_provider_leader", "provider-b", "0x5 1x14"),
            ],
            vec![
                ("3m", "CksProviderNoLeader", vec![]),
                ("6m", "CksProviderNoLeader", vec![]),
            ],
        ),
        // The leader killed at 2m30s and the standby never taking the Lease (its Role lacks a
        // verb, say): pending from 2m30s, firing a minute later.
        case(
            "no replica leads",
            vec![
                series("cks_provider_leader", "provider-a", "1x4 stale"),
                series("cks_provider_leader", "provider-b", "0x19"),
            ],
            vec![
                ("3m", "CksProviderNoLeader", vec![]),
                ("4m", "CksProviderNoLeader", vec![no_leader.clone()]),
            ],
        ),
        // Without --leader-elect no replica exports the gauge: the alert never fires.
        case(
            "one replica without leader election",
            vec![series("cks_provider_ready", "provider-a", "1x30")],
            vec![("10m", "CksProviderNoLeader", vec![])],
        ),
        // A standby that cannot read the ledger is NotReady while the leader serves; scraped
        // (the pods' annotations), it raises NotReady after ten minutes, naming its pod.
        case(
            "a standby that cannot take over",
            vec![
                series("cks_provider_ready", "provider-a", "1x30"),
                series("cks_provider_ready", "provider-b", "0x30"),
                series("cks_provider_leader", "provider-a", "1x30"),
                series("cks_provider_leader", "provider-b", "0x30"),
            ],
            vec![
                ("9m", "CksProviderNotReady", vec![]),
                (
                    "11m",
                    "CksProviderNotReady",
                    vec![standby_not_ready.clone()],
                ),
                ("11m", "CksProviderNoLeader", vec![]),
            ],
        ),
    ];
    dir.write(
        "alerts.test.json",
        serde_json::to_string(&json!({
            "rule_files": ["rules.json"],
            "evaluation_interval": "30s",
            "tests": tests,
        }))
        .expect("tests"),
    );
    let (ok, said) = run(
        &promtool,
        &["test", "rules", "alerts.test.json"],
        &dir.path(""),
    );
    assert!(ok, "promtool test rules:\n{said}");

    // The check can fail: an alert expected where the rules raise none is caught.
    dir.write(
        "wrong.test.json",
        serde_json::to_string(&json!({
            "rule_files": ["rules.json"],
            "evaluation_interval": "30s",
            "tests": [case(
                "a failover taken for an outage",
                vec![
                    series("cks_provider_leader", "provider-a", "1x4 stale"),
                    series("cks_provider_leader", "provider-b", "0x5 1x14"),
                ],
                vec![("6m", "CksProviderNoLeader", vec![no_leader])],
            )],
        }))
        .expect("tests"),
    );
    let (ok, said) = run(
        &promtool,
        &["test", "rules", "wrong.test.json"],
        &dir.path(""),
    );
    assert!(
        !ok,
        "promtool passed an alert the rules never raise:\n{said}"
    );
}
