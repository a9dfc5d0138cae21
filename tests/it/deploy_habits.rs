//! The Helm chart against the habits of an operator coming from upstream's cluster-autoscaler
//! chart (kubernetes/autoscaler, charts/cluster-autoscaler, values.yaml at tag
//! cluster-autoscaler-chart-9.51.0): there the top-level values are the autoscaler's, here the
//! provider's. Each upstream value this chart would ignore or hand to the wrong container must be
//! refused at render time with a message naming where the chart takes it; the conveniences
//! operators look for there (extra env, init containers, DNS, budgets, relabelings, extra
//! alerting rules, extra RBAC rules) must land in the right field of the right object and still
//! validate. The chart's list of `serve` flags, which top-level `extraArgs` is checked against,
//! must be the flags clap defines.
//!
//! The chart is rendered by Helm itself through `tools/check_manifests.py --render` (the tools of
//! `deploy_manifests`, set up on first use, the tests failing when they cannot be had),
//! which also validates every rendered object against the Kubernetes schemas and the
//! Prometheus Operator CRDs.

use clap::CommandFactory;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use cks_testkit::tools::MANIFEST_TOOLS_MISSING_EXIT as TOOLS_MISSING_EXIT;
const RELEASE: &str = "cks-autoscaler-provider";
const NAMESPACE: &str = "kube-system";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chart_file(path: &str) -> String {
    let path = repo()
        .join("deploy/helm/cks-autoscaler-provider")
        .join(path);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Values that render: an image and one cluster, so that a refusal is for the habit alone.
fn with_basics(mut values: Value) -> Value {
    let obj = values.as_object_mut().expect("case values are a mapping");
    obj.entry("image").or_insert_with(|| json!({}));
    if let Some(image) = obj.get_mut("image").and_then(Value::as_object_mut) {
        image
            .entry("repository")
            .or_insert_with(|| json!("registry.example.com/platform/cks-autoscaler-provider"));
    }
    obj.entry("nodes")
        .or_insert_with(|| json!([{"min": 1, "max": 3, "cluster": "a"}]));
    values
}

/// Upstream habits the chart must refuse, and the phrases its message must hold: the value
/// given, and where this chart takes it.
fn refused_cases() -> Vec<(&'static str, Value, Vec<&'static str>)> {
    vec![
        (
            "an autoscaler flag in the provider's extraArgs",
            json!({"extraArgs": {"expander": "least-waste"}}),
            vec![
                "extraArgs.expander",
                "cluster-autoscaler flag",
                "autoscaler.extraArgs",
            ],
        ),
        (
            "an autoscaler flag in the list form of the provider's extraArgs",
            json!({"extraArgs": ["--scale-down-unneeded-time=5m"]}),
            vec!["--scale-down-unneeded-time", "autoscaler.extraArgs"],
        ),
        (
            "upstream's klog verbosity in the provider's extraArgs",
            json!({"extraArgs": {"v": 4}}),
            vec!["extraArgs.v", "autoscaler.verbosity", "log.filter"],
        ),
        (
            "upstream's default logtostderr in the provider's extraArgs",
            json!({"extraArgs": {"logtostderr": true}}),
            vec!["extraArgs.logtostderr", "autoscaler.extraArgs"],
        ),
        (
            "a flag neither has in the provider's extraArgs",
            json!({"extraArgs": {"job-poll-intervall": "5s"}}),
            vec![
                "extraArgs.job-poll-intervall",
                "not a flag of cks-autoscaler-provider serve",
                "job-poll-interval",
            ],
        ),
        (
            "the admin address, which the chart sets, in the provider's extraArgs",
            json!({"extraArgs": {"admin-listen": "127.0.0.1:9999"}}),
            vec!["admin-listen", "adminListen"],
        ),
        (
            "a provider flag in the autoscaler's extraArgs",
            json!({"autoscaler": {"extraArgs": {"job-poll-interval": "5s"}}}),
            vec![
                "autoscaler.extraArgs.job-poll-interval",
                "top-level extraArgs",
            ],
        ),
        (
            "a cluster-autoscaler release as the provider's image tag",
            json!({"image": {"tag": "v1.33.6"}}),
            vec!["image.tag \"v1.33.6\"", "autoscaler.image.tag"],
        ),
        (
            "an older cluster-autoscaler release as the provider's image tag",
            json!({"image": {"tag": "v1.29.5"}}),
            vec!["image.tag \"v1.29.5\"", "autoscaler.image.tag"],
        ),
        (
            "the cluster-autoscaler's image as the provider's",
            json!({"image": {"repository": "registry.k8s.io/autoscaling/cluster-autoscaler"}}),
            vec!["image.repository", "autoscaler.image.repository"],
        ),
        (
            "upstream's pod securityContext",
            json!({"securityContext": {"runAsUser": 65534, "fsGroup": 65534}}),
            vec!["securityContext.fsGroup", "podSecurityContext"],
        ),
        (
            "upstream's pod securityContext for the autoscaler",
            json!({"autoscaler": {"securityContext": {"fsGroup": 65534}}}),
            vec![
                "autoscaler.securityContext.fsGroup",
                "autoscaler.podSecurityContext",
            ],
        ),
        (
            "a container field in the pod's security context",
            json!({"podSecurityContext": {"readOnlyRootFilesystem": true}}),
            vec![
                "podSecurityContext.readOnlyRootFilesystem",
                "securityContext (the provider's container)",
            ],
        ),
        (
            "upstream's containerSecurityContext",
            json!({"containerSecurityContext": {"readOnlyRootFilesystem": true}}),
            vec![
                "containerSecurityContext",
                "autoscaler.securityContext",
                "securityContext (the provider's container)",
            ],
        ),
        (
            "upstream's containerSecurityContext under autoscaler",
            json!({"autoscaler": {"containerSecurityContext": {}}}),
            vec![
                "autoscaler.containerSecurityContext",
                "autoscaler.securityContext",
            ],
        ),
        (
            "upstream's autoscalingGroups",
            json!({"autoscalingGroups": [{"name": "workers", "minSize": 1, "maxSize": 5}]}),
            vec!["autoscalingGroups", "nodes[]"],
        ),
        (
            "upstream's kubeTargetVersionOverride",
            json!({"kubeTargetVersionOverride": "1.33.0"}),
            vec!["kubeTargetVersionOverride", "autoscaler.kubernetesMinor"],
        ),
        (
            "upstream's customArgs",
            json!({"customArgs": ["--expander=least-waste"]}),
            vec!["customArgs", "autoscaler.extraArgs"],
        ),
        (
            "upstream's cloudProvider",
            json!({"cloudProvider": "externalgrpc"}),
            vec!["cloudProvider", "--cloud-provider=externalgrpc"],
        ),
        (
            "upstream's cloudConfigPath",
            json!({"cloudConfigPath": "/etc/cloud/cloud-config"}),
            vec!["cloudConfigPath", "cloudConfig.secretName"],
        ),
        (
            "upstream's rbac.serviceAccount",
            json!({"rbac": {"serviceAccount": {"name": "ca"}}}),
            vec![
                "rbac",
                "autoscaler.serviceAccount",
                "autoscaler.rbac.additionalRules",
            ],
        ),
        (
            "another cloud's credentials",
            json!({"awsRegion": "eu-west-1"}),
            vec!["awsRegion", "cloudConfig.secretName"],
        ),
        (
            "upstream's envFromSecret",
            json!({"envFromSecret": "proxy"}),
            vec!["envFromSecret", "autoscaler.envFrom"],
        ),
        (
            "upstream's updateStrategy",
            json!({"updateStrategy": {"type": "Recreate"}}),
            vec!["updateStrategy", "autoscaler.updateStrategy"],
        ),
        (
            "upstream's serviceMonitor.selector",
            json!({"serviceMonitor": {"selector": {"release": "kube-prometheus-stack"}}}),
            vec!["serviceMonitor.selector", "serviceMonitor.labels"],
        ),
        (
            "upstream's prometheusRule.additionalLabels",
            json!({"prometheusRule": {"additionalLabels": {"release": "kube-prometheus-stack"}}}),
            vec!["prometheusRule.additionalLabels", "prometheusRule.labels"],
        ),
        (
            "upstream's service.servicePort",
            json!({"service": {"servicePort": 8085}}),
            vec![
                "service.servicePort",
                "autoscaler.metricsPort",
                "autoscaler.service",
            ],
        ),
        (
            "upstream's podDisruptionBudget.minAvailable",
            json!({"podDisruptionBudget": {"minAvailable": 1}}),
            vec![
                "podDisruptionBudget.minAvailable",
                "podDisruptionBudget.maxUnavailable",
            ],
        ),
        (
            "a budget that lets a drain take both replicas",
            json!({"podDisruptionBudget": {"maxUnavailable": 2}}),
            vec!["podDisruptionBudget.maxUnavailable 2 with replicaCount 2"],
        ),
        (
            "a budget that never lets the provider's node go",
            json!({"replicaCount": 1, "podDisruptionBudget": {"maxUnavailable": 0}}),
            vec!["podDisruptionBudget.maxUnavailable 0", "1 or more"],
        ),
        (
            "a budget in percent",
            json!({"podDisruptionBudget": {"maxUnavailable": "50%"}}),
            vec!["podDisruptionBudget.maxUnavailable 50%", "whole number"],
        ),
        (
            "a values file written for upstream's chart: every habit in one refusal",
            json!({
                "autoscalingGroups": [{"name": "workers", "minSize": 1, "maxSize": 5}],
                "cloudProvider": "externalgrpc",
                "kubeTargetVersionOverride": "1.33.0",
                "customArgs": ["--balance-similar-node-groups"],
                "rbac": {"serviceAccount": {"name": "cluster-autoscaler"}},
                "extraArgs": {"expander": "least-waste", "v": 4},
                "image": {"repository": "registry.k8s.io/autoscaling/cluster-autoscaler", "tag": "v1.33.6"},
                "securityContext": {"fsGroup": 65534}
            }),
            vec![
                "10 values refused at once",
                "\n- autoscalingGroups",
                "nodes[]",
                "\n- cloudProvider",
                "\n- kubeTargetVersionOverride",
                "\n- customArgs",
                "\n- rbac",
                "\n- extraArgs.expander",
                "\n- extraArgs.v",
                "\n- image.tag \"v1.33.6\"",
                "\n- image.repository",
                "\n- securityContext.fsGroup",
            ],
        ),
        (
            "a Kubernetes minor that is no version",
            json!({"autoscaler": {"kubernetesMinor": "latest"}}),
            vec![
                "autoscaler.kubernetesMinor \"latest\"",
                "write the minor",
                "\"1.31\"",
            ],
        ),
        (
            "upstream's extraEnv in neither form",
            json!({"extraEnv": "HTTP_PROXY=x"}),
            vec!["extraEnv must be a list", "map NAME: value"],
        ),
    ]
}

/// Values that must render: what the provider does take, close to each refusal above, so that
/// a refusal cannot be a blanket one.
fn accepted_cases() -> Vec<(&'static str, Value)> {
    vec![
        (
            "serve flags in extraArgs, map and list forms",
            json!({"extraArgs": {"job-poll-interval": "5s", "template-label": ["a=b", "c=d"]}}),
        ),
        (
            "a serve flag and its value as two list items",
            json!({"extraArgs": ["--job-poll-interval", "5s"]}),
        ),
        (
            "autoscaler flags in autoscaler.extraArgs",
            json!({"autoscaler": {"extraArgs": {"expander": "least-waste", "scale-down-unneeded-time": "5m", "logtostderr": true}}}),
        ),
        (
            "the provider's own version as its tag",
            json!({"image": {"tag": "0.1.0"}}),
        ),
        (
            "a v-prefixed provider tag",
            json!({"image": {"tag": "v0.2.0"}}),
        ),
        (
            "a container-level securityContext with upstream's user",
            json!({"securityContext": {"runAsUser": 65534, "runAsGroup": 65534}}),
        ),
        (
            "a budget of one with one replica",
            json!({"replicaCount": 1, "podDisruptionBudget": {"maxUnavailable": 1}}),
        ),
        (
            "the server version kubectl version prints as the Kubernetes minor",
            json!({"autoscaler": {"kubernetesMinor": "v1.31.4"}}),
        ),
        (
            "a patch version and a distribution's suffix as the Kubernetes minor",
            json!({"autoscaler": {"kubernetesMinor": "1.31.4+k3s1"}}),
        ),
    ]
}

/// Every convenience at once, to check where each lands.
fn conveniences() -> Value {
    json!({
        "replicaCount": 3,
        "podDisruptionBudget": {"maxUnavailable": 2},
        "extraEnv": {"HTTPS_PROXY": "http://proxy.example.com:3128", "RETRIES": 3},
        "envFrom": [{"secretRef": {"name": "provider-env"}}],
        "podLabels": {"team": "platform"},
        "dnsPolicy": "Default",
        "dnsConfig": {"options": [{"name": "ndots", "value": "2"}]},
        "initContainers": [{"name": "wait", "image": "registry.example.com/busybox:1.36", "command": ["true"]}],
        "serviceMonitor": {
            "enabled": true,
            "namespace": "monitoring",
            "relabelings": [{"targetLabel": "cluster", "replacement": "prod-a"}],
            "metricRelabelings": [{"action": "drop", "sourceLabels": ["__name__"], "regex": "go_gc_.*"}]
        },
        "prometheusRule": {
            "enabled": true,
            "namespace": "monitoring",
            "rules": [{"alert": "CksProviderExtra", "expr": "up{job=\"{{ .Release.Name }}\"} == 0", "for": "5m"}]
        },
        "autoscaler": {
            "extraEnv": [{"name": "GOMAXPROCS", "value": "1"}],
            "envFrom": [{"configMapRef": {"name": "autoscaler-env"}}],
            "podLabels": {"team": "platform-ca"},
            "dnsPolicy": "ClusterFirst",
            "dnsConfig": {"options": [{"name": "ndots", "value": "1"}]},
            "initContainers": [{"name": "wait-ca", "image": "registry.example.com/busybox:1.36", "command": ["true"]}],
            "rbac": {"additionalRules": [{"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["get", "list"]}]}
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Rendering through the tools

struct Outcome {
    refused: bool,
    message: String,
    docs: Vec<Value>,
    problems: Vec<String>,
}

enum Run {
    Missing(String),
    Ran(std::collections::BTreeMap<String, Outcome>),
}

/// An operator's own values file, unlike the examples' in every value an overlay could undo:
/// its image, its cluster and bounds, its Kubernetes minor.
fn operators_values() -> Value {
    json!({
        "image": {"repository": "registry.corp.example/ops/cks-autoscaler-provider", "tag": "0.1.0"},
        "nodes": [{"cluster": "prod-a", "min": 2, "max": 7}],
        "autoscaler": {"kubernetesMinor": "1.31"}
    })
}

/// Cases rendered from values files merged in order, as `helm -f a -f b` merges them, with no
/// values added: the operator's file under each overlay of `deploy/examples` (a file whose
/// render line names the file it goes on).
fn layered_cases() -> Vec<(String, Vec<PathBuf>)> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("deploy-habits");
    fs::create_dir_all(&dir).expect("create the render directory");
    let own = dir.join("my-values.yaml");
    fs::write(
        &own,
        serde_json::to_string_pretty(&operators_values()).expect("values"),
    )
    .expect("write the operator's values");
    overlays()
        .into_iter()
        .map(|(overlay, _)| {
            (
                format!("my-values.yaml under {}", overlay.display()),
                vec![own.clone(), overlay],
            )
        })
        .collect()
}

/// The overlays of `deploy/examples`: each file whose `# render:` line says `on=FILE`, with
/// that FILE.
fn overlays() -> Vec<(PathBuf, PathBuf)> {
    let dir = repo().join("deploy/examples");
    let mut out: Vec<(PathBuf, PathBuf)> = fs::read_dir(&dir)
        .expect("deploy/examples")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter_map(|p| {
            let text = fs::read_to_string(&p).ok()?;
            let line = text.lines().find(|l| l.starts_with("# render:"))?;
            let on = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("on="))?;
            Some((p.clone(), dir.join(on)))
        })
        .collect();
    out.sort();
    out
}

fn all_cases() -> Vec<(String, Value)> {
    let mut cases: Vec<(String, Value)> = refused_cases()
        .into_iter()
        .map(|(name, values, _)| (name.to_string(), values))
        .chain(
            accepted_cases()
                .into_iter()
                .map(|(name, values)| (name.to_string(), values)),
        )
        .collect();
    cases.push(("conveniences".into(), conveniences()));
    cases.push(("defaults".into(), json!({})));
    cases.push((
        "conveniences without extra rules".into(),
        json!({"serviceMonitor": {"enabled": true}, "prometheusRule": {"enabled": true}}),
    ));
    cases
}

fn run() -> &'static Run {
    static RUN: OnceLock<Run> = OnceLock::new();
    RUN.get_or_init(|| {
        let python = match cks_testkit::tools::manifest_python() {
            Ok(python) => python,
            Err(e) => return Run::Missing(e.to_string()),
        };
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("deploy-habits");
        fs::create_dir_all(&dir).expect("create the render directory");
        let spec: Vec<Value> = all_cases()
            .into_iter()
            .map(|(name, values)| {
                json!({"name": name, "values": with_basics(values), "release": RELEASE, "namespace": NAMESPACE})
            })
            .chain(layered_cases().into_iter().map(|(name, files)| {
                json!({"name": name, "files": files, "values": {}, "release": RELEASE, "namespace": NAMESPACE})
            }))
            .collect();
        let spec_path = dir.join("spec.json");
        let out_path = dir.join("results.json");
        fs::write(&spec_path, serde_json::to_vec(&spec).expect("spec")).expect("write spec");
        let _ = fs::remove_file(&out_path);
        let output = Command::new(&python)
            .arg(repo().join("tools/check_manifests.py"))
            .arg("--render")
            .arg(&spec_path)
            .arg("--render-out")
            .arg(&out_path)
            .output();
        let output = match output {
            Err(e) => return Run::Missing(format!("{}: {e}", python.display())),
            Ok(o) => o,
        };
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        if output.status.code() == Some(TOOLS_MISSING_EXIT) {
            return Run::Missing(said.trim().to_string());
        }
        assert!(
            output.status.success(),
            "check_manifests.py --render failed:\n{said}"
        );
        let results: Vec<Value> = serde_json::from_str(
            &fs::read_to_string(&out_path).unwrap_or_else(|e| panic!("results: {e}\n{said}")),
        )
        .expect("results are JSON");
        let outcomes = results
            .into_iter()
            .map(|r| {
                let name = r["name"].as_str().unwrap_or_default().to_string();
                let stream = r["stream"].as_str().unwrap_or_default();
                // Kubernetes' YAML reader takes `0440` as octal, so this one does too.
                let options = serde_saphyr::options! { legacy_octal_numbers: true };
                let docs = if stream.is_empty() {
                    Vec::new()
                } else {
                    serde_saphyr::from_multiple_with_options::<Value>(stream, options)
                        .unwrap_or_else(|e| panic!("{name}: rendered YAML unreadable: {e}"))
                        .into_iter()
                        .filter(|d| !d.is_null())
                        .collect()
                };
                let outcome = Outcome {
                    refused: r["refused"] == Value::Bool(true),
                    message: r["message"].as_str().unwrap_or_default().to_string(),
                    docs,
                    problems: r["problems"]
                        .as_array()
                        .map(|p| p.iter().filter_map(Value::as_str).map(String::from).collect())
                        .unwrap_or_default(),
                };
                (name, outcome)
            })
            .collect();
        Run::Ran(outcomes)
    })
}

/// The outcome of a case. Without the tools the test fails: a check that did not run is no pass.
fn outcome(name: &str) -> &'static Outcome {
    match run() {
        Run::Missing(why) => panic!(
            "the manifest tools are missing: {why}\nInstall them with tools/install-manifest-tools.sh"
        ),
        Run::Ran(outcomes) => outcomes
            .get(name)
            .unwrap_or_else(|| panic!("no result for case {name}")),
    }
}

fn rendered(name: &str) -> &'static Outcome {
    let o = outcome(name);
    assert!(!o.refused, "{name}: refused: {}", o.message);
    assert!(
        o.problems.is_empty(),
        "{name}: rendered objects fail validation:\n{}",
        o.problems.join("\n")
    );
    o
}

fn find<'a>(o: &'a Outcome, kind: &str, name: &str) -> &'a Value {
    o.docs
        .iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

const PROVIDER: &str = "cks-autoscaler-provider";
const AUTOSCALER: &str = "cks-cluster-autoscaler";

// ---------------------------------------------------------------------------------------------
// Tests

/// The flags clap gives `serve` (its own and the global ones), without help and version.
fn clap_serve_flags() -> BTreeSet<String> {
    let mut cli = cks_autoscaler_provider::cli::Cli::command();
    cli.build();
    let serve = cli
        .find_subcommand("serve")
        .expect("the CLI has a serve subcommand");
    serve
        .get_arguments()
        .filter_map(|a| a.get_long())
        .filter(|l| !matches!(*l, "help" | "version"))
        .map(String::from)
        .collect()
}

#[test]
fn the_charts_serve_flags_are_the_flags_clap_defines() {
    let chart: BTreeSet<String> = chart_file("files/serve-flags.txt")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    let clap = clap_serve_flags();
    assert!(
        clap.contains("job-poll-interval") && clap.contains("log-format"),
        "clap's serve flags lack known ones (the global --log-format among them): {clap:?}"
    );
    let missing: Vec<_> = clap.difference(&chart).collect();
    let extra: Vec<_> = chart.difference(&clap).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "files/serve-flags.txt differs from `serve`'s flags: missing {missing:?}, not flags of serve {extra:?}"
    );
}

#[test]
fn upstream_habits_are_refused_naming_where_the_chart_takes_them() {
    let mut failures = Vec::new();
    for (name, values, phrases) in refused_cases() {
        let o = outcome(name);
        if !o.refused {
            failures.push(format!(
                "{name}: rendered ({values}); the chart must refuse it"
            ));
            continue;
        }
        for phrase in phrases {
            if !o.message.contains(phrase) {
                failures.push(format!(
                    "{name}: refused without saying {phrase:?}: {}",
                    o.message
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn what_the_provider_takes_still_renders_and_reaches_its_container() {
    for (name, _) in accepted_cases() {
        rendered(name);
    }
    let o = rendered("serve flags in extraArgs, map and list forms");
    let args =
        &find(o, "Deployment", PROVIDER)["spec"]["template"]["spec"]["containers"][0]["args"];
    for arg in [
        "--job-poll-interval=5s",
        "--template-label=a=b",
        "--template-label=c=d",
    ] {
        assert!(
            args.as_array().is_some_and(|a| a.iter().any(|x| x == arg)),
            "{arg} not among the provider's arguments: {args}"
        );
    }
    let o = rendered("autoscaler flags in autoscaler.extraArgs");
    let args =
        &find(o, "Deployment", AUTOSCALER)["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(
        args.as_array()
            .is_some_and(|a| a.iter().any(|x| x == "--expander=least-waste")),
        "--expander=least-waste not among the autoscaler's arguments: {args}"
    );
    let o = rendered("the provider's own version as its tag");
    let image =
        &find(o, "Deployment", PROVIDER)["spec"]["template"]["spec"]["containers"][0]["image"];
    assert_eq!(
        image, "registry.example.com/platform/cks-autoscaler-provider:0.1.0",
        "the provider's image"
    );
}

#[test]
fn conveniences_land_in_their_fields_and_validate() {
    let o = rendered("conveniences");
    let provider = &find(o, "Deployment", PROVIDER)["spec"]["template"];
    let pod = &provider["spec"];
    let container = &pod["containers"][0];
    assert_eq!(provider["metadata"]["labels"]["team"], "platform");
    assert_eq!(pod["dnsPolicy"], "Default");
    assert_eq!(pod["dnsConfig"]["options"][0]["name"], "ndots");
    assert_eq!(pod["initContainers"][0]["name"], "wait");
    assert_eq!(
        container["envFrom"],
        json!([{"secretRef": {"name": "provider-env"}}])
    );
    let env = container["env"].as_array().expect("provider env");
    for (name, value) in [
        ("HTTPS_PROXY", "http://proxy.example.com:3128"),
        ("RETRIES", "3"),
    ] {
        assert!(
            env.iter().any(|e| e["name"] == name && e["value"] == value),
            "{name}={value} not in the provider's env: {env:?}"
        );
    }
    assert!(
        env.iter().any(|e| e["name"] == "RUST_LOG"),
        "the chart's own env is kept: {env:?}"
    );

    let autoscaler = &find(o, "Deployment", AUTOSCALER)["spec"]["template"];
    let pod = &autoscaler["spec"];
    let container = &pod["containers"][0];
    assert_eq!(autoscaler["metadata"]["labels"]["team"], "platform-ca");
    assert_eq!(pod["dnsPolicy"], "ClusterFirst");
    assert_eq!(pod["dnsConfig"]["options"][0]["value"], "1");
    assert_eq!(pod["initContainers"][0]["name"], "wait-ca");
    assert_eq!(
        container["envFrom"],
        json!([{"configMapRef": {"name": "autoscaler-env"}}])
    );
    let env = container["env"].as_array().expect("autoscaler env");
    assert!(
        env.iter()
            .any(|e| e["name"] == "GOMAXPROCS" && e["value"] == "1")
    );
    assert!(env.iter().any(|e| e["name"] == "POD_NAMESPACE"));

    let budget = &find(o, "PodDisruptionBudget", PROVIDER)["spec"];
    assert_eq!(budget["maxUnavailable"], 2);
    assert!(
        budget.get("minAvailable").is_none(),
        "maxUnavailable replaces minAvailable: {budget}"
    );

    for name in [PROVIDER, AUTOSCALER] {
        let monitor = find(o, "ServiceMonitor", name);
        assert_eq!(monitor["metadata"]["namespace"], "monitoring", "{name}");
        assert_eq!(
            monitor["spec"]["namespaceSelector"]["matchNames"],
            json!([NAMESPACE]),
            "{name}: a ServiceMonitor in another namespace selects the release namespace"
        );
        let endpoint = &monitor["spec"]["endpoints"][0];
        assert_eq!(
            endpoint["relabelings"][0]["targetLabel"], "cluster",
            "{name}"
        );
        assert_eq!(endpoint["metricRelabelings"][0]["action"], "drop", "{name}");
    }

    let rule = find(o, "PrometheusRule", PROVIDER);
    assert_eq!(rule["metadata"]["namespace"], "monitoring");
    let groups = rule["spec"]["groups"].as_array().expect("rule groups");
    let extra = groups
        .iter()
        .find(|g| g["name"] == format!("{PROVIDER}-extra"))
        .expect("the extra rules' group");
    assert_eq!(extra["rules"][0]["alert"], "CksProviderExtra");
    assert_eq!(
        extra["rules"][0]["expr"],
        format!("up{{job=\"{RELEASE}\"}} == 0"),
        "extra rules are rendered with tpl"
    );
    // The chart's own groups are those of a render without extra rules, unchanged.
    let plain = rendered("conveniences without extra rules");
    let own: Vec<&Value> = groups.iter().filter(|g| *g != extra).collect();
    let plain_groups: Vec<&Value> = find(plain, "PrometheusRule", PROVIDER)["spec"]["groups"]
        .as_array()
        .expect("rule groups")
        .iter()
        .collect();
    assert!(!plain_groups.is_empty());
    assert_eq!(own, plain_groups, "the chart's own rule groups changed");

    let role = find(o, "ClusterRole", AUTOSCALER);
    let rules = role["rules"].as_array().expect("ClusterRole rules");
    assert_eq!(
        rules.last(),
        Some(
            &json!({"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["get", "list"]})
        ),
        "autoscaler.rbac.additionalRules is appended to the autoscaler's ClusterRole"
    );
}

#[test]
fn budgets_keep_the_chart_rules_unless_told_otherwise() {
    let defaults = rendered("defaults");
    let budget = &find(defaults, "PodDisruptionBudget", PROVIDER)["spec"];
    assert_eq!(budget["minAvailable"], 1, "two replicas: {budget}");
    assert!(budget.get("maxUnavailable").is_none(), "{budget}");
    let pod = &find(defaults, "Deployment", PROVIDER)["spec"]["template"]["spec"];
    for field in ["dnsPolicy", "dnsConfig", "initContainers"] {
        assert!(
            pod.get(field).is_none(),
            "{field} rendered by default: {pod}"
        );
    }
    let one = rendered("a budget of one with one replica");
    assert_eq!(
        find(one, "PodDisruptionBudget", PROVIDER)["spec"]["maxUnavailable"],
        1
    );
}

#[test]
fn the_readme_maps_every_upstream_value_the_brief_names() {
    let readme = chart_file("README.md");
    let table: Vec<&str> = readme
        .split("## Coming from upstream's cluster-autoscaler chart")
        .nth(1)
        .expect("the README has the migration section")
        .lines()
        .filter(|l| l.starts_with('|'))
        .collect();
    for key in [
        "autoscalingGroups",
        "kubeTargetVersionOverride",
        "rbac.serviceAccount",
        "customArgs",
        "extraArgs.v",
        "extraArgs.expander",
        "image.tag",
        "securityContext",
        "containerSecurityContext",
        "cloudProvider",
        "cloudConfigPath",
        "podAnnotations",
        "priorityClassName",
        "resources",
        "nodeSelector",
        "tolerations",
        "affinity",
    ] {
        let needle = format!("`{key}");
        assert!(
            table.iter().any(|row| row
                .split('|')
                .nth(1)
                .is_some_and(|cell| cell.contains(&needle))),
            "the migration table has no row for upstream's {key}"
        );
    }
}

/// The release the chart lists for a Kubernetes minor (values.yaml).
fn listed_release(minor: &str) -> String {
    let values: Value = serde_saphyr::from_str(&chart_file("values.yaml")).expect("values.yaml");
    values["autoscaler"]["image"]["tagByKubernetesMinor"][minor]
        .as_str()
        .unwrap_or_else(|| panic!("values.yaml lists no release for {minor}"))
        .to_string()
}

fn autoscaler_image(o: &Outcome) -> String {
    find(o, "Deployment", AUTOSCALER)["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_kubernetes_version_is_taken_for_its_minor() {
    let want = format!(
        "registry.k8s.io/autoscaling/cluster-autoscaler:{}",
        listed_release("1.31")
    );
    for case in [
        "the server version kubectl version prints as the Kubernetes minor",
        "a patch version and a distribution's suffix as the Kubernetes minor",
    ] {
        assert_eq!(autoscaler_image(rendered(case)), want, "{case}");
    }
}

/// Each overlay of `deploy/examples` goes on top of the operator's own file (`helm -f
/// my-values.yaml -f OVERLAY`): what that file sets must survive it. Helm merges mappings key by
/// key and replaces anything else whole, so an overlay that repeats the example's `nodes`, image
/// or minor puts the example's back in place of the operator's.
#[test]
fn an_overlay_example_keeps_the_operators_image_nodes_and_minor() {
    let cases = layered_cases();
    assert!(
        !cases.is_empty(),
        "deploy/examples has no overlay (a file whose render line says on=FILE)"
    );
    let own = operators_values();
    let mut failures = Vec::new();
    for (name, _) in &cases {
        let o = rendered(name);
        let provider =
            &find(o, "Deployment", PROVIDER)["spec"]["template"]["spec"]["containers"][0];
        let image = provider["image"].as_str().unwrap_or_default();
        let want_image = format!(
            "{}:{}",
            own["image"]["repository"].as_str().unwrap_or_default(),
            own["image"]["tag"].as_str().unwrap_or_default()
        );
        if image != want_image {
            failures.push(format!(
                "{name}: the provider runs {image}, not the operator's {want_image}"
            ));
        }
        let nodes: Vec<&str> = provider["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter(|a| a.starts_with("--nodes"))
            .collect();
        if nodes != ["--nodes=2:7:prod-a"] {
            failures.push(format!(
                "{name}: the provider serves {nodes:?}, not the operator's --nodes=2:7:prod-a"
            ));
        }
        let autoscaler = autoscaler_image(o);
        let want = listed_release("1.31");
        if !autoscaler.ends_with(&format!(":{want}")) {
            failures.push(format!(
                "{name}: the autoscaler runs {autoscaler}, not {want}, the release of the operator's minor 1.31"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every leaf (a scalar or a list, which Helm replaces whole) of a values tree, by its path.
fn leaves(v: &Value, path: &str, out: &mut BTreeSet<String>) {
    match v.as_object() {
        Some(map) if !map.is_empty() => {
            for (k, x) in map {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                leaves(x, &p, out);
            }
        }
        _ => {
            out.insert(path.to_string());
        }
    }
}

/// An overlay carries only what it changes: no value its base file sets (nothing of the
/// operator's own file an overlay could put back to the example's).
#[test]
fn an_overlay_example_sets_nothing_its_base_file_sets() {
    let mut failures = Vec::new();
    for (overlay, base) in overlays() {
        let read = |p: &PathBuf| -> Value {
            serde_saphyr::from_str(
                &fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
            )
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        };
        let (mut over, mut under) = (BTreeSet::new(), BTreeSet::new());
        leaves(&read(&overlay), "", &mut over);
        leaves(&read(&base), "", &mut under);
        // A value the base sets, or a key that holds one of its values (a list or a scalar put
        // over a mapping replaces the mapping whole).
        for leaf in &over {
            if under.iter().any(|u| {
                u == leaf
                    || u.starts_with(&format!("{leaf}."))
                    || leaf.starts_with(&format!("{u}."))
            }) {
                failures.push(format!(
                    "{} sets {leaf}, which its base {} sets: layered on the operator's file it would replace the operator's value",
                    overlay.display(),
                    base.display()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
