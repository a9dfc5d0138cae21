//! Commands the guide (`docs/operations.md`, `README.md`) and the chart's NOTES.txt tell an
//! operator to run against a cluster, checked against the renders of `deploy/` with the real
//! `kubectl` and a real kube-apiserver (`cks_testkit::kube`):
//!
//! - the one-off pod that runs `check` from the image (the first hour's step 2) is admitted by
//!   the API server (`--dry-run=server`): an override naming a field Kubernetes does not have,
//!   or a volume mounted under another name, fails here instead of on the operator's cluster;
//! - every command that reaches a provider pod (`logs`, `exec`, `port-forward`) reaches the
//!   leader, the replica that acts and reads CloudStack, and no standby, in every render where
//!   what it selects exists; a listing of the provider's pods shows which is which (its role
//!   label); `logs -l` reads the whole log (kubectl shows 10 lines of a selected pod
//!   otherwise); `rollout status` of our Deployments gives up before their progress deadline;
//!   and every Deployment, Service, Certificate, Secret, ConfigMap or Lease a command names
//!   exists in a render, or is one the autoscaler, the provider or CKS creates at run time.
//!   What a command selects is computed from the render (its pods as the Deployments' template
//!   labels them, the provider's first replica labelled leader as the provider labels itself,
//!   the others standby) and, for each command kubectl can run without a kubelet, run: the
//!   render's ServiceAccounts, Services and Deployments and those pods are created in a
//!   namespace of their own, and the pods kubectl asked for (its `-v=6` request log, or what it
//!   printed) must be the ones computed;
//! - the kustomize overlay copied as the guide says builds outside `overlays/` too, and the
//!   files the guide points to agree with it (the README's first screen, the example Secret's
//!   `project-id`, `grpc_timeout`).
//!
//! Needs `kubectl` (on PATH, or beside the manifest tools' python), the manifest tools and the
//! API server's binaries: `cks_testkit::tools` sets them up on first use, and the test fails
//! naming what is missing when it cannot.

mod shell;

use cks_testkit::kube::KubeApiServer;
use serde_json::{Value, json};
use shell::Cmd;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The guide's shell block that starts with `first_line`, its lines continued by `\` joined.
fn guide_command(first_line: &str) -> String {
    let guide = read("docs/operations.md");
    let start = guide
        .find(first_line)
        .unwrap_or_else(|| panic!("docs/operations.md has no command starting {first_line:?}"));
    let block = &guide[start..];
    let end = block
        .match_indices('\n')
        .find(|(i, _)| block[i + 1..].trim_start().starts_with("```"))
        .map_or(block.len(), |(i, _)| i);
    block[..end].replace("\\\n", " ")
}

/// Splits a command line as `sh` would for the quoting the guide uses (single quotes, plain
/// words); anything else is refused rather than guessed.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                in_word = true;
            }
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '"' | '$' | '`' | '\\' if !quoted => {
                panic!("the guide's command uses {c:?} outside single quotes: {line}")
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    assert!(!quoted, "unbalanced single quote in {line}");
    if in_word {
        out.push(word);
    }
    out
}

#[tokio::test]
async fn the_check_pod_of_the_guide_is_admitted_by_a_real_api_server() {
    let kubectl = cks_testkit::tools::kubectl().unwrap_or_else(|e| panic!("{e}"));
    let kube = KubeApiServer::start()
        .await
        .unwrap_or_else(|e| panic!("the Kubernetes API server did not start: {e}"));
    // What kube-controller-manager would have made: the namespace's default ServiceAccount,
    // without which a Pod is refused.
    kube.create(
        "/api/v1/namespaces/kube-system/serviceaccounts",
        &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
    )
    .await
    .expect("create the default ServiceAccount");

    // The namespace enforces the restricted Pod Security level, as the provider's own may: a
    // Pod that breaks it is refused, so the command must hold in such a namespace too.
    let labelled = kube
        .send(
            reqwest::Method::PATCH,
            "/api/v1/namespaces/kube-system",
            "application/merge-patch+json",
            json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
                .to_string(),
        )
        .await
        .expect("label kube-system");
    assert!(
        (200..300).contains(&labelled.status),
        "label kube-system restricted: HTTP {}: {}",
        labelled.status,
        labelled.body
    );

    let line = guide_command("kubectl -n kube-system run cks-check");
    let mut args = words(&line);
    assert_eq!(args.first().map(String::as_str), Some("kubectl"), "{line}");
    args.remove(0);
    // An attached pod removed afterwards cannot be a dry run: what it creates is the same.
    args.retain(|a| a != "--rm" && a != "-i");
    let ca = kube.ca_file();
    let output = Command::new(&kubectl)
        .args(&args)
        .arg("--dry-run=server")
        .arg("-o")
        .arg("json")
        .arg("--server")
        .arg(kube.url())
        .arg("--token")
        .arg(kube.admin_token())
        .arg("--certificate-authority")
        .arg(&ca)
        .env("KUBECONFIG", "/dev/null")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", kubectl.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "kubectl {}\nrefused: {stderr}{stdout}",
        args.join(" ")
    );
    let pod: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("kubectl's answer is no JSON ({e}): {stdout}"));
    let spec = &pod["spec"];
    let container = &spec["containers"][0];
    let arg_list: Vec<&str> = container["args"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert_eq!(arg_list.first(), Some(&"check"), "{pod}");
    let config_at = arg_list
        .iter()
        .position(|a| *a == "--cloud-config")
        .and_then(|i| arg_list.get(i + 1))
        .unwrap_or_else(|| panic!("no --cloud-config in {arg_list:?}"));
    assert!(
        arg_list.contains(&"--nodes"),
        "the check pod names no --nodes: {arg_list:?}"
    );
    // The cloud-config the pod reads is the key of the Secret the provider reads, where the
    // pod mounts it.
    let mount = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| {
            m["mountPath"]
                .as_str()
                .is_some_and(|p| config_at.starts_with(&format!("{}/", p.trim_end_matches('/'))))
        })
        .unwrap_or_else(|| panic!("no volume is mounted where {config_at} is: {pod}"));
    let volume = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("the mount names no volume of the pod: {pod}"));
    assert_eq!(volume["secret"]["secretName"], "cloudstack-secret", "{pod}");
    assert!(
        config_at.ends_with("/cloud-config"),
        "the pod reads {config_at}, not the Secret's cloud-config key"
    );
    assert_eq!(pod["spec"]["restartPolicy"], "Never", "{pod}");
}

// ---------------------------------------------------------------------------------------------
// The renders

/// The label the provider puts on its own pod, and its two values.
const ROLE: &str = "cks-autoscaler-provider/role";

/// One render of `deploy/`: its objects, and what `helm install` printed (Helm renders).
struct Render {
    name: String,
    namespace: String,
    objects: Vec<Value>,
    notes: Option<String>,
}

/// Kubernetes' YAML reader takes `0440` as octal, so this one does too.
fn parse_yaml(text: &str, what: &str) -> Vec<Value> {
    let options = serde_saphyr::options! { legacy_octal_numbers: true };
    serde_saphyr::from_multiple_with_options::<Value>(text, options)
        .unwrap_or_else(|e| panic!("{what}: not YAML: {e}"))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// Every render, as `tools/check_manifests.py --render-only` writes them (and each Helm
/// render's NOTES.txt): once per test process, for the tests that read them at once.
fn renders() -> &'static [Render] {
    static RENDERS: std::sync::OnceLock<Vec<Render>> = std::sync::OnceLock::new();
    RENDERS.get_or_init(render_all)
}

fn render_all() -> Vec<Render> {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("guide-renders");
    let index = cks_testkit::tools::render_manifests(&out);
    index["sets"]
        .as_array()
        .expect("index.json lists its sets")
        .iter()
        .map(|s| {
            let field = |f: &str| s[f].as_str().unwrap_or_default().to_string();
            let text = std::fs::read_to_string(out.join(field("file"))).expect("a render");
            Render {
                name: field("name"),
                namespace: field("namespace"),
                objects: parse_yaml(&text, &field("name")),
                notes: s["notes"]
                    .as_str()
                    .map(|f| std::fs::read_to_string(out.join(f)).expect("a NOTES.txt")),
            }
        })
        .collect()
}

/// The renders the guide's commands are written for: the objects of the kustomize example
/// overlay and of the chart installed as the guide installs it (release
/// `cks-autoscaler-provider` in `kube-system`): the first hour's values, with its overlay, and
/// both sides of one provider for many clusters.
const GUIDE_RENDERS: [&str; 6] = [
    "kustomize-overlays-example",
    "helm-deploy-examples-single-project-cluster",
    "helm-deploy-examples-watch-first-removal",
    "helm-deploy-examples-central-provider",
    "helm-examples-central-provider",
    "helm-examples-workload-cluster",
];

/// A pod as the Deployment's ReplicaSet would make it, with the role label the provider sets.
#[derive(Clone, Debug)]
struct Pod {
    name: String,
    labels: BTreeMap<String, String>,
    containers: Vec<String>,
    /// A replica of the provider.
    provider: bool,
    /// The provider's leader, or its only replica (no leader election).
    leader: bool,
    /// The Deployment's template, to create it from.
    spec: Value,
}

fn labels(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

fn kind_of(o: &Value) -> &str {
    o["kind"].as_str().unwrap_or_default()
}

fn name_of(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or_default()
}

fn args_of(d: &Value) -> Vec<String> {
    d["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

fn is_provider(d: &Value) -> bool {
    args_of(d).first().map(String::as_str) == Some("serve")
}

impl Render {
    fn of_kind(&self, kind: &str) -> impl Iterator<Item = &Value> {
        self.objects.iter().filter(move |o| kind_of(o) == kind)
    }

    fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.of_kind(kind).find(|o| name_of(o) == name)
    }

    /// The pods of every Deployment: the provider's first replica labelled leader, the others
    /// standby, as a provider with `--leader-elect` labels itself; a provider without it, one
    /// pod and no label.
    fn pods(&self) -> Vec<Pod> {
        let mut pods = Vec::new();
        for d in self.of_kind("Deployment") {
            let replicas = d["spec"]["replicas"].as_u64().unwrap_or(1);
            let provider = is_provider(d);
            let elect = args_of(d).iter().any(|a| a == "--leader-elect");
            let template = &d["spec"]["template"];
            let containers = template["spec"]["containers"]
                .as_array()
                .map(|c| {
                    c.iter()
                        .filter_map(|c| c["name"].as_str())
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default();
            for i in 0..replicas {
                let mut labels = labels(&template["metadata"]["labels"]);
                if provider && elect {
                    let role = if i == 0 { "leader" } else { "standby" };
                    labels.insert(ROLE.into(), role.into());
                }
                pods.push(Pod {
                    name: format!("{}-{i}", name_of(d)),
                    labels,
                    containers: Vec::clone(&containers),
                    provider,
                    leader: provider && i == 0,
                    spec: template["spec"].clone(),
                });
            }
        }
        pods
    }

    /// The name of the provider's leader-election Lease (`--leader-elect-resource-name`, the
    /// provider's name by default).
    fn leases(&self) -> Vec<String> {
        self.of_kind("Deployment")
            .filter(|d| is_provider(d))
            .map(|d| {
                args_of(d)
                    .iter()
                    .find_map(|a| a.strip_prefix("--leader-elect-resource-name="))
                    .map_or_else(|| name_of(d).to_string(), String::from)
            })
            .collect()
    }

    /// Secrets the render mounts that cert-manager writes (a Certificate's `secretName`).
    fn certificate_secrets(&self) -> Vec<String> {
        self.of_kind("Certificate")
            .filter_map(|c| c["spec"]["secretName"].as_str())
            .map(String::from)
            .collect()
    }
}

/// A label selector as kubectl reads `-l`: `k=v`, `k==v`, `k!=v`, `k`, `!k`, comma-separated.
fn selects(selector: &str, labels: &BTreeMap<String, String>) -> bool {
    selector
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .all(|term| {
            if let Some((k, v)) = term.split_once("!=") {
                labels.get(k.trim()).map(String::as_str) != Some(v.trim())
            } else if let Some((k, v)) = term.split_once('=') {
                let v = v.trim_start_matches('=');
                labels.get(k.trim()).map(String::as_str) == Some(v.trim())
            } else if let Some(k) = term.strip_prefix('!') {
                !labels.contains_key(k)
            } else {
                labels.contains_key(term)
            }
        })
}

fn selector_of(map: &BTreeMap<String, String>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

// ---------------------------------------------------------------------------------------------
// What a kubectl command does

/// kubectl's flags that take a value (when not written `--flag=value`).
const VALUED: [&str; 31] = [
    "-n",
    "--namespace",
    "--context",
    "--kube-context",
    "-l",
    "--selector",
    "-o",
    "--output",
    "-c",
    "--container",
    "-L",
    "--label-columns",
    "--tail",
    "--timeout",
    "-f",
    "--filename",
    "--image",
    "--replicas",
    "--overrides",
    "--requests",
    "--limits",
    "-p",
    "--patch",
    "--from-file",
    "--from-literal",
    "--type",
    "--since",
    "--restart",
    "--sort-by",
    "--field-manager",
    "--dry-run",
];

/// One `kubectl` command, read as kubectl reads its arguments.
#[derive(Debug, Default)]
struct Kubectl {
    namespace: Option<String>,
    positional: Vec<String>,
    flags: BTreeMap<String, String>,
}

impl Kubectl {
    fn parse(words: &[String]) -> Kubectl {
        let mut k = Kubectl::default();
        let mut it = words.iter().skip(1);
        while let Some(w) = it.next() {
            if w == "--" {
                break;
            }
            if w.starts_with('-') && w.len() > 1 {
                let (name, value) = match w.split_once('=') {
                    Some((n, v)) => (n.to_string(), v.to_string()),
                    None if VALUED.contains(&w.as_str()) => {
                        (w.clone(), it.next().cloned().unwrap_or_default())
                    }
                    None => (w.clone(), String::new()),
                };
                if matches!(name.as_str(), "-n" | "--namespace") {
                    k.namespace = Some(value.clone());
                }
                k.flags.insert(name, value);
            } else {
                k.positional.push(w.clone());
            }
        }
        k
    }

    fn flag(&self, names: &[&str]) -> Option<&str> {
        names
            .iter()
            .find_map(|n| self.flags.get(*n))
            .map(String::as_str)
    }

    fn verb(&self) -> &str {
        self.positional.first().map_or("", String::as_str)
    }

    fn arg(&self, i: usize) -> Option<&str> {
        self.positional.get(i).map(String::as_str)
    }
}

/// What a command reaches.
#[derive(Debug)]
enum Target {
    /// The pods a selector picks (`-l`, a Service's selector, a `$(kubectl get pod -l …)`).
    Selected { selector: String, via: String },
    /// One pod of a Deployment, whichever kubectl picks.
    AnyOf { deployment: String },
    /// The pod the operator names (`<pod>`).
    Named,
    /// A Service (its selector read from the render).
    Service(String),
}

fn kind_alias(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "deploy" | "deployment" | "deployments" | "deployment.apps" => "Deployment",
        "svc" | "service" | "services" => "Service",
        "certificate" | "certificates" | "cert" | "certificates.cert-manager.io" => "Certificate",
        "secret" | "secrets" => "Secret",
        "configmap" | "configmaps" | "cm" => "ConfigMap",
        "lease" | "leases" => "Lease",
        "pod" | "pods" | "po" => "Pod",
        _ => return None,
    })
}

/// `TYPE/NAME`, or `TYPE NAME` from position `at`.
fn object_at(k: &Kubectl, at: usize) -> Option<(&'static str, String)> {
    let first = k.arg(at)?;
    if let Some((kind, name)) = first.split_once('/') {
        return Some((kind_alias(kind)?, name.to_string()));
    }
    let kind = kind_alias(first)?;
    Some((kind, k.arg(at + 1)?.to_string()))
}

// ---------------------------------------------------------------------------------------------
// Running kubectl against the API server

/// The API server with every render's objects, each render in a namespace of its own.
struct Cluster {
    kube: KubeApiServer,
    kubectl: PathBuf,
    ca: PathBuf,
    /// Render name → the namespace its objects are in here.
    namespaces: BTreeMap<String, String>,
}

impl Cluster {
    async fn start(renders: &[&Render]) -> Cluster {
        let kubectl = cks_testkit::tools::kubectl().unwrap_or_else(|e| panic!("{e}"));
        let kube = KubeApiServer::start()
            .await
            .unwrap_or_else(|e| panic!("the Kubernetes API server did not start: {e}"));
        let ca = kube.ca_file();
        let mut namespaces = BTreeMap::new();
        for (i, r) in renders.iter().enumerate() {
            let ns = format!("render-{i}");
            kube.create_namespace(&ns)
                .await
                .expect("create a namespace");
            for o in &r.objects {
                let collection = match kind_of(o) {
                    "ServiceAccount" => format!("/api/v1/namespaces/{ns}/serviceaccounts"),
                    "Service" => format!("/api/v1/namespaces/{ns}/services"),
                    "Deployment" => format!("/apis/apps/v1/namespaces/{ns}/deployments"),
                    _ => continue,
                };
                let mut o = o.clone();
                o["metadata"]["namespace"] = json!(ns);
                kube.create(&collection, &o)
                    .await
                    .unwrap_or_else(|e| panic!("{}: {e}", r.name));
            }
            for p in r.pods() {
                // A ServiceAccount the render names and does not create (one of the operator's).
                if let Some(sa) = p.spec["serviceAccountName"].as_str() {
                    let account = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}});
                    kube.create(
                        &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
                        &account,
                    )
                    .await
                    .expect("create a ServiceAccount");
                }
                let pod = json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": p.name, "namespace": ns, "labels": p.labels},
                    "spec": p.spec,
                });
                kube.create(&format!("/api/v1/namespaces/{ns}/pods"), &pod)
                    .await
                    .unwrap_or_else(|e| panic!("{}: pod {}: {e}", r.name, p.name));
            }
            namespaces.insert(r.name.clone(), ns);
        }
        Cluster {
            kube,
            kubectl,
            ca,
            namespaces,
        }
    }

    /// Runs `words` (a kubectl command) in `render`'s namespace, with `-v=6`: the pods it
    /// asked for (a pod's log, a pod to forward to) or printed (`get`), and its request log.
    fn run(&self, render: &str, words: &[String]) -> (BTreeSet<String>, String) {
        let ns = &self.namespaces[render];
        let mut args: Vec<String> = Vec::new();
        let mut it = words.iter().skip(1).peekable();
        while let Some(w) = it.next() {
            match w.as_str() {
                "-n" | "--namespace" | "--context" | "--kube-context" => {
                    it.next();
                }
                w if w.starts_with("--namespace=") || w.starts_with("--context=") => {}
                _ => args.push(w.clone()),
            }
        }
        let output = Command::new(&self.kubectl)
            .arg("--server")
            .arg(self.kube.url())
            .arg("--token")
            .arg(self.kube.admin_token())
            .arg("--certificate-authority")
            .arg(&self.ca)
            .arg("-n")
            .arg(ns)
            .arg("-v=6")
            .args(&args)
            .env("KUBECONFIG", "/dev/null")
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", self.kubectl.display()));
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        let stderr = String::from_utf8_lossy(&output.stderr).to_string();
        let mut pods = BTreeSet::new();
        let prefix = format!("/namespaces/{ns}/pods/");
        for line in stderr.lines().filter(|l| l.contains("verb=\"GET\"")) {
            let Some(url) = line
                .split("url=\"")
                .nth(1)
                .and_then(|u| u.split('"').next())
            else {
                continue;
            };
            let path = url.split('?').next().unwrap_or(url);
            if let Some(rest) = path.split(&prefix).nth(1) {
                pods.insert(rest.split('/').next().unwrap_or(rest).to_string());
            }
        }
        // What `get` printed: `pod/NAME`, or a table whose first column is the name.
        let get = words.iter().skip(1).any(|w| w == "get");
        for line in stdout.lines().filter(|_| get) {
            let first = line.split_whitespace().next().unwrap_or_default();
            let name = first.strip_prefix("pod/").unwrap_or(first);
            if name != "NAME" && !name.is_empty() {
                pods.insert(name.to_string());
            }
        }
        (pods, format!("{stdout}{stderr}"))
    }
}

// ---------------------------------------------------------------------------------------------
// The checks

/// Seconds of a kubectl duration (`3m`, `180s`, `2m30s`, `1h`).
fn seconds(text: &str) -> Option<u64> {
    let mut total = 0;
    let mut number = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let n: u64 = number.parse().ok()?;
        number.clear();
        total += n * match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return None,
        };
    }
    number.is_empty().then_some(total)
}

/// Whether an object a command names exists in `r`, or is one that something creates at run
/// time: the autoscaler's status ConfigMap, CKS's own autoscaler and cloud-config Secret, the
/// Secrets cert-manager writes for the render's Certificates, the provider's Lease.
fn exists(r: &Render, kind: &str, name: &str) -> bool {
    r.find(kind, name).is_some()
        || match kind {
            "ConfigMap" => name == "cluster-autoscaler-status",
            "Deployment" => name == "cluster-autoscaler",
            "Secret" => {
                name == "cloudstack-secret" || r.certificate_secrets().iter().any(|s| s == name)
            }
            "Lease" => r.leases().iter().any(|l| l == name),
            _ => false,
        }
}

/// What one command does wrong against the renders it is written for (those of its namespace);
/// with a cluster, what kubectl does is run and compared where it can be. `reached` counts the
/// commands that reach a provider pod, so that a test can tell it checked some.
fn examine(
    cmd: &Cmd,
    renders: &[&Render],
    cluster: Option<&Cluster>,
    reached: &mut usize,
) -> Vec<String> {
    if cmd.words.first().map(String::as_str) != Some("kubectl") {
        return Vec::new();
    }
    let line = cmd.words.join(" ");
    let at = |what: String| format!("{}: `{line}`: {what}", cmd.origin);
    let k = Kubectl::parse(&cmd.words);
    let ours: Vec<&Render> = renders
        .iter()
        .copied()
        .filter(|r| k.namespace.as_deref() == Some(r.namespace.as_str()))
        .collect();
    if ours.is_empty() {
        // Another namespace (cert-manager's, the default one), or cluster-wide: not our pods.
        return Vec::new();
    }
    let mut problems = Vec::new();
    let verb = k.verb();
    let target = match verb {
        "logs" | "exec" | "port-forward" | "attach" | "cp" => {
            if let Some(sel) = k.flag(&["-l", "--selector"]) {
                Some(Target::Selected {
                    selector: sel.to_string(),
                    via: "-l".into(),
                })
            } else {
                match k.arg(1) {
                    Some(t) if t.starts_with('$') => {
                        let var = t
                            .trim_start_matches('$')
                            .trim_matches(|c| c == '{' || c == '}');
                        match cmd.defs.get(var).map(|d| Kubectl::parse(d)) {
                            Some(def) if def.flag(&["-l", "--selector"]).is_some() => {
                                Some(Target::Selected {
                                    selector: def
                                        .flag(&["-l", "--selector"])
                                        .unwrap_or_default()
                                        .to_string(),
                                    via: format!("${var}"),
                                })
                            }
                            _ => {
                                problems.push(at(format!("{t} is no pod this test can resolve")));
                                None
                            }
                        }
                    }
                    Some(t) if t.starts_with('<') => Some(Target::Named),
                    Some(t) => match t.split_once('/') {
                        Some((kind, name)) => match kind_alias(kind) {
                            Some("Deployment") => Some(Target::AnyOf {
                                deployment: name.into(),
                            }),
                            Some("Service") => Some(Target::Service(name.into())),
                            _ => Some(Target::Named),
                        },
                        None => Some(Target::Named),
                    },
                    None => None,
                }
            }
        }
        "get" | "describe" if matches!(k.arg(1), Some("pod" | "pods" | "po")) => {
            k.flag(&["-l", "--selector"]).map(|sel| Target::Selected {
                selector: sel.to_string(),
                via: "-l".into(),
            })
        }
        _ => None,
    };
    if let Some(target) = target {
        let reaches = matches!(verb, "logs" | "exec" | "port-forward" | "attach" | "cp");
        let mut applied = 0;
        for r in &ours {
            let pods = r.pods();
            let (selected, real): (Vec<&Pod>, bool) = match &target {
                Target::Named => (Vec::new(), false),
                Target::Selected { selector, .. } => (
                    pods.iter()
                        .filter(|p| selects(selector, &p.labels))
                        .collect(),
                    true,
                ),
                Target::AnyOf { deployment } => match r.find("Deployment", deployment) {
                    Some(_) => (
                        pods.iter()
                            .filter(|p| {
                                p.name
                                    .rsplit_once('-')
                                    .is_some_and(|(d, _)| d == deployment)
                            })
                            .collect(),
                        true,
                    ),
                    None => (Vec::new(), false),
                },
                Target::Service(name) => match r.find("Service", name) {
                    Some(svc) => {
                        let sel = selector_of(&labels(&svc["spec"]["selector"]));
                        (
                            pods.iter().filter(|p| selects(&sel, &p.labels)).collect(),
                            true,
                        )
                    }
                    None => (Vec::new(), false),
                },
            };
            if selected.is_empty() {
                continue;
            }
            applied += 1;
            if selected.iter().any(|p| p.provider) {
                *reached += 1;
            }
            let standbys: Vec<&str> = selected
                .iter()
                .filter(|p| p.provider && !p.leader)
                .map(|p| p.name.as_str())
                .collect();
            let shows_role = k
                .flag(&["-L", "--label-columns"])
                .is_some_and(|l| l.contains(ROLE))
                || k.flags.contains_key("--show-labels");
            if !standbys.is_empty() && (reaches || !shows_role) {
                problems.push(at(if reaches {
                    format!(
                        "in {} it may reach the standby {standbys:?}: only the leader (label {ROLE}=leader) acts and reads CloudStack",
                        r.name
                    )
                } else {
                    format!(
                        "in {} it lists the standby {standbys:?} without showing its role: add -L {ROLE}",
                        r.name
                    )
                }));
            }
            if let (Some(c), "exec") = (k.flag(&["-c", "--container"]), verb) {
                for p in &selected {
                    if !p.containers.iter().any(|x| x == c) {
                        problems.push(at(format!(
                            "in {}: pod {} has no container {c}",
                            r.name, p.name
                        )));
                    }
                }
            }
            // What kubectl itself does, where it can without a kubelet.
            let runnable = match verb {
                "logs" | "port-forward" | "get" => Some(cmd.words.clone()),
                "exec" => match &target {
                    Target::Selected { via, .. } if via.starts_with('$') => {
                        cmd.defs.get(via.trim_start_matches('$')).cloned()
                    }
                    _ => None,
                },
                _ => None,
            };
            if let (Some(cluster), Some(words), true) = (cluster, runnable, real) {
                let (asked, said) = cluster.run(&r.name, &words);
                let want: BTreeSet<String> = selected.iter().map(|p| p.name.clone()).collect();
                let one = matches!(target, Target::AnyOf { .. } | Target::Service(_))
                    || verb == "port-forward";
                let agrees = if one {
                    asked.len() == 1 && asked.is_subset(&want)
                } else {
                    asked == want
                };
                if !agrees {
                    problems.push(at(format!(
                        "in {}: kubectl reached {asked:?}, the render's pods say {want:?}:\n{said}",
                        r.name
                    )));
                }
                if verb == "logs"
                    && k.flag(&["--tail"]) == Some("-1")
                    && said.contains("tailLines=")
                {
                    problems.push(at(format!(
                        "in {}: kubectl asked for part of the log:\n{said}",
                        r.name
                    )));
                }
            }
        }
        if applied == 0 && !matches!(target, Target::Named) {
            problems.push(at(format!(
                "selects nothing in {}",
                ours.iter()
                    .map(|r| r.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        if verb == "logs"
            && k.flag(&["-l", "--selector"]).is_some()
            && k.flag(&["--tail"]).is_none()
        {
            problems.push(at(
                "with -l, kubectl logs shows the last 10 lines of each pod: give --tail=-1 (or a count)".into(),
            ));
        }
    }
    // The objects a command names.
    let named = match verb {
        "get" | "describe" if !matches!(k.arg(1), Some("pod" | "pods" | "po")) => object_at(&k, 1),
        "rollout" => object_at(&k, 2),
        _ => None,
    };
    if let Some((kind, name)) = named {
        if name.contains('$') {
            problems.push(at(format!("{name} is a name this test cannot resolve")));
        } else if !name.starts_with('<') {
            let found: Vec<&&Render> = ours.iter().filter(|r| exists(r, kind, &name)).collect();
            if found.is_empty() {
                problems.push(at(format!(
                    "no {kind} {name} in {}",
                    ours.iter()
                        .map(|r| r.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            if verb == "rollout" && k.arg(1) == Some("status") {
                match k.flag(&["--timeout"]).map(seconds) {
                    None => problems.push(at(
                        "rollout status without --timeout waits out the Deployment's progress deadline (10 minutes) when a pod does not become Ready".into(),
                    )),
                    Some(None) => problems.push(at("--timeout is no duration".into())),
                    Some(Some(t)) => {
                        for r in &found {
                            if let Some(d) = r.find("Deployment", &name) {
                                let deadline = d["spec"]["progressDeadlineSeconds"].as_u64().unwrap_or(600);
                                if t >= deadline {
                                    problems.push(at(format!(
                                        "--timeout {t}s is not shorter than the progress deadline {deadline}s in {}",
                                        r.name
                                    )));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    problems
}

/// The commands of the guide: `docs/operations.md` and the README.
fn guide_commands() -> Vec<Cmd> {
    ["docs/operations.md", "README.md"]
        .iter()
        .flat_map(|f| shell::markdown(f, &read(f)))
        .collect()
}

/// The commands a render's NOTES.txt prints: its lines that start with `kubectl`.
fn notes_commands(r: &Render) -> Vec<Cmd> {
    r.notes
        .as_deref()
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("kubectl "))
        .flat_map(|l| shell::script(&format!("NOTES.txt of {}", r.name), l))
        .collect()
}

#[tokio::test]
async fn every_command_of_the_guide_and_the_notes_reaches_the_leader_and_names_what_exists() {
    let all = renders();
    let guide: Vec<&Render> = GUIDE_RENDERS
        .iter()
        .map(|n| {
            all.iter()
                .find(|r| r.name == *n)
                .unwrap_or_else(|| panic!("no render {n}: the guide's commands are written for it"))
        })
        .collect();
    let with_notes: Vec<&Render> = all.iter().filter(|r| r.notes.is_some()).collect();
    assert!(
        with_notes.len() >= 10,
        "{} Helm renders with NOTES.txt",
        with_notes.len()
    );
    let mut involved: Vec<&Render> = guide.clone();
    for r in &with_notes {
        if !involved.iter().any(|g| g.name == r.name) {
            involved.push(r);
        }
    }
    let cluster = Cluster::start(&involved).await;
    let mut problems = Vec::new();
    let (mut guide_reached, mut notes_reached) = (0, 0);
    for cmd in guide_commands() {
        problems.extend(examine(&cmd, &guide, Some(&cluster), &mut guide_reached));
    }
    for r in &with_notes {
        for cmd in notes_commands(r) {
            problems.extend(examine(&cmd, &[r], Some(&cluster), &mut notes_reached));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
    // Not vacuous: the guide reads the leader's log, lists the replicas, execs probe in the
    // leader and forwards to it; every NOTES with a provider reads its log.
    assert!(
        guide_reached >= 8,
        "only {guide_reached} guide commands reached a provider pod"
    );
    let with_provider = with_notes
        .iter()
        .filter(|r| r.pods().iter().any(|p| p.provider))
        .count();
    assert!(
        notes_reached >= 2 * with_provider,
        "{notes_reached} NOTES commands reached a provider pod, for {with_provider} renders with a provider"
    );
}

/// The check itself: what the guide used to print, and what it must not.
#[test]
fn a_command_that_may_reach_the_standby_or_waits_out_the_deadline_is_caught() {
    let all = renders();
    let r = all
        .iter()
        .find(|r| r.name == "helm-deploy-examples-single-project-cluster")
        .expect("the first hour's render");
    let problems = |line: &str| {
        let cmds = shell::script("case", line);
        let mut n = 0;
        examine(&cmds[0], &[r], None, &mut n).join("\n")
    };
    for (line, want) in [
        (
            "kubectl -n kube-system logs deploy/cks-autoscaler-provider",
            "may reach the standby",
        ),
        (
            "kubectl -n kube-system logs -l app.kubernetes.io/name=cks-autoscaler-provider --tail=-1",
            "may reach the standby",
        ),
        (
            "kubectl -n kube-system logs -l app.kubernetes.io/name=cks-autoscaler-provider,cks-autoscaler-provider/role=leader",
            "last 10 lines",
        ),
        (
            "kubectl -n kube-system get pods -l app.kubernetes.io/name=cks-autoscaler-provider",
            "without showing its role",
        ),
        (
            "kubectl -n kube-system rollout status deploy/cks-autoscaler-provider",
            "progress deadline",
        ),
        (
            "kubectl -n kube-system rollout status deploy/cks-autoscaler-provider --timeout=10m",
            "not shorter",
        ),
        (
            "kubectl -n kube-system logs -l app.kubernetes.io/name=cks-autoscaler-provder,cks-autoscaler-provider/role=leader --tail=-1",
            "selects nothing",
        ),
        (
            "kubectl -n kube-system get lease cks-provider",
            "no Lease cks-provider",
        ),
    ] {
        let said = problems(line);
        assert!(said.contains(want), "`{line}`: want {want:?}, got: {said}");
    }
    for line in [
        "kubectl -n kube-system logs -l app.kubernetes.io/name=cks-autoscaler-provider,cks-autoscaler-provider/role=leader --tail=-1",
        "kubectl -n kube-system logs svc/cks-autoscaler-provider",
        "kubectl -n kube-system get pods -l app.kubernetes.io/name=cks-autoscaler-provider -L cks-autoscaler-provider/role",
        "kubectl -n kube-system rollout status deploy/cks-autoscaler-provider --timeout=3m",
        "kubectl -n kube-system logs deploy/cks-cluster-autoscaler",
        "kubectl -n kube-system get lease cks-autoscaler-provider",
    ] {
        assert_eq!(problems(line), "", "`{line}`");
    }
}

// ---------------------------------------------------------------------------------------------
// The guide against the files it points to

/// The commands of the guide's shell block that starts with `first_line`, as written.
fn guide_block(first_line: &str) -> String {
    let guide = read("docs/operations.md");
    let start = guide
        .find(first_line)
        .unwrap_or_else(|| panic!("docs/operations.md has no block starting {first_line:?}"));
    let block = &guide[start..];
    let end = block.find("\n```").expect("the block ends");
    block[..end].to_string()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create a directory");
    for entry in std::fs::read_dir(from).expect("read a directory") {
        let entry = entry.expect("an entry");
        let path = entry.path();
        if path.is_dir() {
            copy_dir(&path, &to.join(entry.file_name()));
        } else {
            std::fs::copy(&path, to.join(entry.file_name())).expect("copy a file");
        }
    }
}

/// §2.2's two ways to keep an overlay outside the repository's `overlays/` (copy
/// `deploy/kustomize` whole, or rewrite the overlay's `../../`), run as written from a clone's
/// root with a home of their own: both overlays build with `kubectl kustomize` alone.
#[test]
fn the_kustomize_overlay_builds_where_the_guide_copies_it() {
    let kubectl = cks_testkit::tools::kubectl().unwrap_or_else(|e| panic!("{e}"));
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("guide-overlay");
    let _ = std::fs::remove_dir_all(&dir);
    let (clone, home) = (dir.join("clone"), dir.join("home"));
    copy_dir(&repo().join("deploy"), &clone.join("deploy"));
    std::fs::create_dir_all(&home).expect("a home");
    let block = guide_block("cp -r deploy/kustomize ~/cks-autoscaler");
    let run = Command::new("sh")
        .arg("-ec")
        .arg(&block)
        .current_dir(&clone)
        .env("HOME", &home)
        .output()
        .expect("sh");
    assert!(
        run.status.success(),
        "{block}\n{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    // The clone moved away from the overlay kept alone would break it; both builds run with
    // the clone in place, as the guide has it.
    for overlay in [
        home.join("cks-autoscaler/overlays/mine"),
        home.join("gitops/cks"),
    ] {
        let built = Command::new(&kubectl)
            .arg("kustomize")
            .arg(&overlay)
            .output()
            .expect("kubectl kustomize");
        let out = String::from_utf8_lossy(&built.stdout);
        assert!(
            built.status.success() && out.contains("name: cks-autoscaler-provider"),
            "kubectl kustomize {}: {}{out}",
            overlay.display(),
            String::from_utf8_lossy(&built.stderr)
        );
    }
}

/// GitHub's anchor of a Markdown heading: lowercase, punctuation but `-` and `_` dropped,
/// spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim_start_matches('#')
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The README opens with the two developer commands, exactly, and its first screen sends an
/// operator to the guide's one path (a link whose anchor is that section's).
#[test]
fn the_readmes_first_screen_sends_an_operator_to_the_first_hour() {
    let readme = read("README.md");
    let lines: Vec<&str> = readme.lines().collect();
    let commands: Vec<&str> = lines
        .iter()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .take(2)
        .map(|l| l.split('#').next().unwrap_or_default().trim())
        .collect();
    assert_eq!(
        commands,
        ["cargo run --release --bin cks-demo", "cargo test"],
        "the README's first lines"
    );
    let guide = read("docs/operations.md");
    let heading = guide
        .lines()
        .find(|l| l.starts_with("## The first hour"))
        .expect("the guide's one path");
    let link = format!("docs/operations.md#{}", anchor(heading));
    let screen = lines
        .iter()
        .take(20)
        .copied()
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        screen.contains(&link),
        "the README's first screen has no link {link}:\n{screen}"
    );
}

/// The path's minutes per step add up to its total, and the total is half an hour or less.
#[test]
fn the_first_hour_adds_up_to_thirty_minutes_or_less() {
    let guide = read("docs/operations.md");
    let start = guide.find("## The first hour").expect("the path");
    let rows: Vec<Vec<String>> = guide[start..]
        .lines()
        .skip_while(|l| !l.starts_with("| Step |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.split('|')
                .map(|c| c.trim().trim_matches('*').to_string())
                .collect()
        })
        .collect();
    let minutes = |row: &Vec<String>| -> u32 {
        row[2]
            .parse()
            .unwrap_or_else(|_| panic!("no minutes in {row:?}"))
    };
    let (total, steps): (Vec<_>, Vec<_>) = rows.iter().partition(|r| r[1] == "in all");
    assert_eq!(total.len(), 1, "one total row: {rows:?}");
    let sum: u32 = steps.iter().map(|r| minutes(r)).sum();
    assert_eq!(
        sum,
        minutes(total[0]),
        "the steps' minutes against the total"
    );
    assert!(sum <= 30, "the first hour takes {sum} minutes");
    assert_eq!(steps.len(), 8, "{steps:?}");
}

/// Every cloud-config shown with a `project-id` line says, on it or just above, that a
/// project's cluster requires it (CloudStack lists a project's clusters only to a call naming
/// the project: the guide's §4), and none files it under "Optional".
#[test]
fn every_example_cloud_config_calls_project_id_required_for_a_project() {
    let mut problems = Vec::new();
    for file in [
        "README.md",
        "docs/operations.md",
        "deploy/kustomize/examples/cloudstack-secret.yaml",
        "deploy/examples/single-project-cluster.yaml",
    ] {
        let text = read(file);
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            // An ini line of a cloud-config (commented out or not), not prose about one.
            let ini = l.trim_start().trim_start_matches('#').trim_start();
            if !ini.starts_with("project-id =") {
                continue;
            }
            let window = lines[i.saturating_sub(2)..=i].join("\n").to_lowercase();
            if !window.contains("required")
                || lines[i.saturating_sub(1)]
                    .to_lowercase()
                    .contains("optional")
            {
                problems.push(format!("{file}:{}: {l}", i + 1));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "project-id not called required for a project's cluster:\n{}",
        problems.join("\n")
    );
}

/// The README's cloud-config for the autoscaler, the chart's default and the kustomize base give
/// the same `grpc_timeout`.
#[test]
fn the_readme_and_deploy_give_the_autoscaler_one_grpc_timeout() {
    let grab = |text: &str, key: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.trim().strip_prefix(key))
            .map(|v| v.trim().trim_matches('"').to_string())
            .collect()
    };
    let readme = grab(&read("README.md"), "grpc_timeout:");
    let chart = grab(
        &read("deploy/helm/cks-autoscaler-provider/values.yaml"),
        "grpcTimeout:",
    );
    let base = grab(
        &read("deploy/kustomize/base/autoscaler-cloud-config.yaml"),
        "grpc_timeout:",
    );
    assert_eq!(chart.len(), 1, "{chart:?}");
    assert!(!readme.is_empty(), "the README shows no grpc_timeout");
    for (what, values) in [("README.md", &readme), ("the kustomize base", &base)] {
        assert!(
            values.iter().all(|v| *v == chart[0]),
            "{what} gives grpc_timeout {values:?}, the chart {}",
            chart[0]
        );
    }
}
