//! What no tool checks in `deploy/`: that its files agree with each other.
//!
//! The tools check each file: `tools/check_manifests.py` builds every kustomization with
//! `kubectl kustomize` (every Component on the base), renders the Helm chart with Helm itself
//! for each values file of `deploy/helm/cks-autoscaler-provider/ci/` and `deploy/helm/examples/`
//! (after `helm lint --strict`), refuses duplicate YAML keys, and validates every object
//! against the Kubernetes schemas of the oldest and the newest supported minor (cert-manager and
//! Prometheus Operator objects against their CRDs). This test runs it once and fails on what it
//! reports; then it reads what the tools rendered and follows the references an apiserver,
//! kubelet, cert-manager or the autoscaler would follow across objects and files: ports
//! (container, Service, probes, NetworkPolicy, the autoscaler's `address`), the Secret and
//! ConfigMap keys behind every path given in arguments, the server certificate's names against
//! the host each autoscaler dials, the clients `--nodes …@CLIENT` binds against the client
//! certificates' DNS names, the cloud-config the autoscaler reads, security contexts, image
//! pins, RBAC, the autoscaler release per Kubernetes minor (chart, kustomize components, README),
//! the chart's defaults against the kustomize base, a central provider against a workload
//! cluster's autoscaler, the Dockerfile against the Deployment, the provider image against the
//! values (and the chart's refusal without one), one `--max-node-provision-time` for the
//! provider and its autoscalers, the metrics Services against the containers and the
//! ServiceMonitors, the chart's PrometheusRule against `docs/prometheus-rules.yaml`, and
//! `extraArgs` against the arguments rendered.
//!
//! The tools come from `tools/install-manifest-tools.sh` (a virtual environment under
//! `target/manifest-tools`, or `CKS_MANIFEST_TOOLS=<its python>`), which `cks_testkit::tools`
//! runs on first use; every test here fails naming what is missing when they cannot be had.
//!
//! Each check returns the problems it found, so the `*_is_caught` tests can break one piece of
//! rendered wiring in memory and show that the check notices.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const PROVIDER_BINARY: &str = "/usr/local/bin/cks-autoscaler-provider";
const CERT_MANAGER_KEYS: [&str; 3] = ["tls.crt", "tls.key", "ca.crt"];
const AUTOSCALER_IMAGE: &str = "registry.k8s.io/autoscaling/cluster-autoscaler";
/// The pod annotation naming the autoscaler's client identity (its certificate's DNS name).
const CLIENT_ANNOTATION: &str = "cks-autoscaler-provider/client";
/// The label the provider's leader gives its own pod (`--leader-elect`): its Services select it,
/// so that autoscalers reach the leader alone.
const LEADER_LABEL: (&str, &str) = ("cks-autoscaler-provider/role", "leader");
/// The Lease `--leader-elect` takes without `--leader-elect-resource-name`.
const DEFAULT_LEASE: &str = "cks-autoscaler-provider";
use cks_testkit::tools::MANIFEST_TOOLS_MISSING_EXIT as TOOLS_MISSING_EXIT;

// ---------------------------------------------------------------------------------------------
// Running the tools

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chart_dir() -> PathBuf {
    repo().join("deploy/helm/cks-autoscaler-provider")
}

/// What the tools rendered, one set per kustomization, example file or Helm values file.
#[derive(Clone, Debug)]
struct Rendered {
    /// The oldest and the newest Kubernetes minor the objects were validated against.
    minors: Vec<String>,
    sets: Vec<Set>,
    /// The values the chart was given to refuse, and what Helm said.
    refusals: Vec<Refusal>,
}

/// Values `tools/check_manifests.py` renders the chart with that it must refuse.
#[derive(Clone, Debug)]
struct Refusal {
    what: String,
    values: Value,
    refused: bool,
    message: String,
}

impl Rendered {
    fn set(&self, name: &str) -> &Set {
        self.sets
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no rendered set {name}"))
    }
}

enum ToolsRun {
    Missing(String),
    Ran {
        ok: bool,
        output: String,
        rendered: Result<Rendered, String>,
    },
}

fn tools_run() -> &'static ToolsRun {
    static RUN: OnceLock<ToolsRun> = OnceLock::new();
    RUN.get_or_init(run_tools)
}

fn run_tools() -> ToolsRun {
    let python = match cks_testkit::tools::manifest_python() {
        Ok(python) => python,
        Err(e) => return ToolsRun::Missing(e.to_string()),
    };
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rendered-manifests");
    let run = Command::new(&python)
        .arg(repo().join("tools/check_manifests.py"))
        .arg("--out")
        .arg(&out)
        .output();
    match run {
        Err(e) => ToolsRun::Missing(format!("{}: {e}", python.display())),
        Ok(o) => {
            let output = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            if o.status.code() == Some(TOOLS_MISSING_EXIT) {
                return ToolsRun::Missing(output.trim().to_string());
            }
            ToolsRun::Ran {
                ok: o.status.success(),
                output,
                rendered: load_rendered(&out),
            }
        }
    }
}

/// The rendered sets. Without the tools the test fails: a check that did not run is no pass.
fn rendered() -> &'static Rendered {
    match tools_run() {
        ToolsRun::Missing(why) => panic!(
            "the manifest tools are missing: {why}\nInstall them with tools/install-manifest-tools.sh"
        ),
        ToolsRun::Ran {
            rendered: Ok(r), ..
        } => r,
        ToolsRun::Ran {
            rendered: Err(e),
            output,
            ..
        } => panic!("tools/check_manifests.py left nothing readable ({e}):\n{output}"),
    }
}

/// Parses every document of a YAML text. Kubernetes' YAML reader takes `0440` as octal, so
/// this one does too.
fn parse_yaml(text: &str) -> Result<Vec<Value>, String> {
    let options = serde_saphyr::options! { legacy_octal_numbers: true };
    serde_saphyr::from_multiple_with_options::<Value>(text, options).map_err(|e| e.to_string())
}

fn load_yaml(path: &Path) -> Result<Vec<Value>, String> {
    let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_yaml(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn load_rendered(dir: &Path) -> Result<Rendered, String> {
    let index: Value = serde_json::from_str(
        &fs::read_to_string(dir.join("index.json")).map_err(|e| format!("index.json: {e}"))?,
    )
    .map_err(|e| format!("index.json: {e}"))?;
    let minors = strings_at(&index, "/minors");
    let mut sets = Vec::new();
    for entry in arr_at(&index, "/sets") {
        let field = |f: &str| str_at(entry, &format!("/{f}")).unwrap_or("").to_string();
        let name = field("name");
        let docs = load_yaml(&dir.join(field("file")))?
            .into_iter()
            .filter(|v| !v.is_null())
            .map(|v| Doc {
                set: name.clone(),
                v,
            })
            .collect();
        let source = field("source");
        // The values rendered: the index's (an overlay's merged on the file it names), else
        // the values file's.
        let values = if let Some(values) = entry.pointer("/values") {
            values.clone()
        } else if source == "helm" {
            load_yaml(&repo().join(field("origin")))?
                .into_iter()
                .next()
                .unwrap_or(Value::Null)
        } else {
            Value::Null
        };
        sets.push(Set {
            name,
            source,
            namespace: field("namespace"),
            docs,
            external: Vec::new(),
            values,
        });
    }
    // The objects an operator creates by hand (deploy/kustomize/examples) exist beside every
    // set, as they would in the cluster.
    let external: Vec<Doc> = sets
        .iter()
        .filter(|s| s.source == "example")
        .flat_map(|s| s.docs.clone())
        .collect();
    for s in &mut sets {
        s.external = external.clone();
    }
    let refusals = arr_at(&index, "/refusals")
        .iter()
        .map(|r| Refusal {
            what: str_at(r, "/what").unwrap_or("").to_string(),
            values: r.pointer("/values").cloned().unwrap_or(Value::Null),
            refused: r.pointer("/refused") == Some(&Value::Bool(true)),
            message: str_at(r, "/message").unwrap_or("").to_string(),
        })
        .collect();
    Ok(Rendered {
        minors,
        sets,
        refusals,
    })
}

// ---------------------------------------------------------------------------------------------
// Small accessors

fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

fn arr_at<'a>(v: &'a Value, pointer: &str) -> &'a [Value] {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn strings_at(v: &Value, pointer: &str) -> Vec<String> {
    arr_at(v, pointer)
        .iter()
        .filter_map(|x| x.as_str().map(str::to_string))
        .collect()
}

fn labels_at(v: &Value, pointer: &str) -> BTreeMap<String, String> {
    v.pointer(pointer)
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), scalar(v)))
                .collect::<BTreeMap<_, _>>()
        })
        .unwrap_or_default()
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A non-empty selector whose every label the pod carries.
fn selects(selector: &BTreeMap<String, String>, pod_labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v))
}

/// `--name=value` or `--name value` values of a flag, in order.
fn flag_values(args: &[String], name: &str) -> Vec<String> {
    let long = format!("--{name}");
    let mut out = Vec::new();
    let mut it = args.iter().peekable();
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix(&format!("{long}=")) {
            out.push(v.to_string());
        } else if *a == long {
            match it.peek() {
                Some(next) if !next.starts_with("--") => {
                    out.push((*next).clone());
                    it.next();
                }
                _ => out.push(String::new()),
            }
        }
    }
    out
}

fn flag(args: &[String], name: &str) -> Option<String> {
    flag_values(args, name).into_iter().next()
}

/// Flags as a map (`--name` → values), the first argument (a subcommand) left out.
fn flag_map(args: &[String]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for a in args.iter().filter(|a| a.starts_with("--")) {
        let (name, value) = a.split_once('=').unwrap_or((a.as_str(), ""));
        out.entry(name.to_string())
            .or_default()
            .push(value.to_string());
    }
    out
}

fn port_of(host_port: &str) -> Option<u64> {
    host_port.rsplit_once(':')?.1.parse().ok()
}

fn host_of(host_port: &str) -> Option<&str> {
    let (host, _) = host_port.rsplit_once(':')?;
    Some(host.trim_start_matches('[').trim_end_matches(']'))
}

/// A Go duration such as `10s`, `1m30s`, `500ms`, in milliseconds.
fn go_duration_ms(text: &str) -> Option<u64> {
    let mut total = 0f64;
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let factor = match &rest[..u] {
            "ms" => 1.0,
            "s" => 1_000.0,
            "m" => 60_000.0,
            "h" => 3_600_000.0,
            _ => return None,
        };
        total += number * factor;
        rest = &rest[u..];
    }
    Some(total as u64)
}

/// One `--nodes` value: `MIN:MAX:CLUSTER` or `MIN:MAX:CLUSTER@CLIENT`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Group {
    cluster: String,
    client: Option<String>,
}

fn parse_group(spec: &str) -> Option<Group> {
    let mut parts = spec.splitn(3, ':');
    let (min, max, rest) = (parts.next()?, parts.next()?, parts.next()?);
    min.parse::<u64>().ok()?;
    max.parse::<u64>().ok()?;
    let (cluster, client) = match rest.split_once('@') {
        Some((c, client)) => (c, Some(client.to_string())),
        None => (rest, None),
    };
    (!cluster.is_empty()).then(|| Group {
        cluster: cluster.to_string(),
        client,
    })
}

fn image_name(image: &str) -> &str {
    let no_digest = image.split('@').next().unwrap_or(image);
    match no_digest.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => name,
        _ => no_digest,
    }
}

fn image_tag(image: &str) -> Option<&str> {
    let no_digest = image.split('@').next().unwrap_or(image);
    match no_digest.rsplit_once(':') {
        Some((_, tag)) if !tag.contains('/') => Some(tag),
        _ => None,
    }
}

/// The Kubernetes minor of a cluster-autoscaler release tag: `v1.33.6` → `1.33`.
fn release_minor(tag: &str) -> Option<String> {
    let mut parts = tag.strip_prefix('v')?.split('.');
    let (major, minor, patch) = (parts.next()?, parts.next()?, parts.next()?);
    let numeric = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    (numeric(major) && numeric(minor) && numeric(patch) && parts.next().is_none())
        .then(|| format!("{major}.{minor}"))
}

fn minor_number(minor: &str) -> Option<u32> {
    minor.strip_prefix("1.").and_then(|n| n.parse().ok())
}

// ---------------------------------------------------------------------------------------------
// The objects the checks are about

#[derive(Clone, Debug)]
struct Doc {
    set: String,
    v: Value,
}

impl Doc {
    fn kind(&self) -> &str {
        str_at(&self.v, "/kind").unwrap_or("")
    }
    fn name(&self) -> &str {
        str_at(&self.v, "/metadata/name").unwrap_or("")
    }
    fn id(&self) -> String {
        format!("{} {} ({})", self.kind(), self.name(), self.set)
    }
}

/// The objects one kustomization, example file or Helm values file rendered.
#[derive(Clone, Debug)]
struct Set {
    name: String,
    /// `kustomize`, `helm` or `example`.
    source: String,
    /// The release namespace (Helm) or the kustomization's (`kube-system`).
    namespace: String,
    docs: Vec<Doc>,
    /// Objects the operator creates by hand (deploy/kustomize/examples).
    external: Vec<Doc>,
    /// The values file a Helm set was rendered with (`Null` for the others).
    values: Value,
}

struct Workload<'a> {
    doc: &'a Doc,
    pod: &'a Value,
    container: &'a Value,
}

impl Workload<'_> {
    fn args(&self) -> Vec<String> {
        strings_at(self.container, "/args")
    }
    fn pod_labels(&self) -> BTreeMap<String, String> {
        labels_at(&self.doc.v, "/spec/template/metadata/labels")
    }
    fn leader_elect(&self) -> bool {
        self.args().iter().any(|a| a == "--leader-elect")
    }
    /// The labels of the pod that serves: its template's and, with `--leader-elect`, the role
    /// label the leader gives its own pod.
    fn serving_labels(&self) -> BTreeMap<String, String> {
        let mut labels = self.pod_labels();
        if self.leader_elect() {
            labels.insert(LEADER_LABEL.0.into(), LEADER_LABEL.1.into());
        }
        labels
    }
    fn replicas(&self) -> u64 {
        self.doc
            .v
            .pointer("/spec/replicas")
            .and_then(Value::as_u64)
            .unwrap_or(1)
    }
}

impl Set {
    fn of_kind(&self, kind: &str) -> std::vec::IntoIter<&Doc> {
        let docs: Vec<&Doc> = self.docs.iter().filter(|d| d.kind() == kind).collect();
        docs.into_iter()
    }

    fn find(&self, kind: &str, name: &str) -> Option<&Doc> {
        self.of_kind(kind).find(|d| d.name() == name)
    }

    fn workload(&self, what: &str, pick: impl Fn(&Value) -> bool) -> Result<Workload<'_>, String> {
        for d in self.of_kind("Deployment") {
            for c in arr_at(&d.v, "/spec/template/spec/containers") {
                if pick(c) {
                    let pod = d.v.pointer("/spec/template/spec").unwrap_or(&Value::Null);
                    return Ok(Workload {
                        doc: d,
                        pod,
                        container: c,
                    });
                }
            }
        }
        Err(format!("{}: no Deployment runs the {what}", self.name))
    }

    /// The Deployment whose container runs `cks-autoscaler-provider serve`.
    fn provider(&self) -> Result<Workload<'_>, String> {
        self.workload("provider", |c| {
            image_name(str_at(c, "/image").unwrap_or("")).ends_with("cks-autoscaler-provider")
                && strings_at(c, "/args").first().map(String::as_str) == Some("serve")
        })
    }

    /// The Deployment whose container runs the cluster-autoscaler with externalgrpc.
    fn autoscaler(&self) -> Result<Workload<'_>, String> {
        self.workload(
            "cluster-autoscaler with --cloud-provider=externalgrpc",
            |c| flag(&strings_at(c, "/args"), "cloud-provider").as_deref() == Some("externalgrpc"),
        )
    }

    fn has_provider(&self) -> bool {
        self.provider().is_ok()
    }

    fn has_autoscaler(&self) -> bool {
        self.autoscaler().is_ok()
    }

    /// The provider's own Service: the one named as its Deployment (the gRPC host), selecting
    /// the pod that serves (with `--leader-elect`, the leader's).
    fn provider_service(&self) -> Result<&Doc, String> {
        let p = self.provider()?;
        let labels = p.serving_labels();
        self.of_kind("Service")
            .find(|s| {
                s.name() == p.doc.name() && selects(&labels_at(&s.v, "/spec/selector"), &labels)
            })
            .ok_or_else(|| format!("{}: no Service named as the provider selects it", self.name))
    }

    /// The Services that reach the autoscaler's pods (its metrics Service).
    fn autoscaler_services(&self) -> Vec<&Doc> {
        let Ok(a) = self.autoscaler() else {
            return Vec::new();
        };
        let labels = a.pod_labels();
        self.of_kind("Service")
            .filter(|svc| selects(&labels_at(&svc.v, "/spec/selector"), &labels))
            .collect()
    }

    /// Whether a ServiceMonitor of the set selects `svc` and scrapes one of its ports (the
    /// Prometheus Operator then names the series' job after the Service).
    fn scraped(&self, svc: &Doc) -> bool {
        self.of_kind("ServiceMonitor").any(|sm| {
            selects(
                &labels_at(&sm.v, "/spec/selector/matchLabels"),
                &labels_at(&svc.v, "/metadata/labels"),
            ) && arr_at(&sm.v, "/spec/endpoints")
                .iter()
                .any(|e| str_at(e, "/port").is_some_and(|p| service_port(svc, p).is_some()))
        })
    }

    /// Services besides the provider's own that reach its pods (for other clusters).
    fn external_services(&self) -> Vec<&Doc> {
        let Ok(p) = self.provider() else {
            return Vec::new();
        };
        let labels = p.serving_labels();
        self.of_kind("Service")
            .filter(|s| {
                s.name() != p.doc.name() && selects(&labels_at(&s.v, "/spec/selector"), &labels)
            })
            .collect()
    }

    /// Whether cert-manager issues this set's certificates (else the operator supplies them).
    fn uses_cert_manager(&self) -> bool {
        self.of_kind("Certificate").next().is_some()
    }

    fn certificate_for_secret(&self, secret: &str) -> Option<&Doc> {
        self.of_kind("Certificate")
            .find(|c| str_at(&c.v, "/spec/secretName") == Some(secret))
    }

    /// The keys a Secret of this name will have: a cert-manager Certificate writes tls.crt,
    /// tls.key and ca.crt; a Secret object (in the set or the examples) has its own keys.
    /// `None`: the operator creates it, with keys the files cannot tell.
    fn secret_keys(&self, name: &str) -> Option<BTreeSet<String>> {
        if self.certificate_for_secret(name).is_some() {
            return Some(CERT_MANAGER_KEYS.iter().map(|k| k.to_string()).collect());
        }
        self.docs
            .iter()
            .chain(self.external.iter())
            .find(|d| d.kind() == "Secret" && d.name() == name)
            .map(|d| {
                let mut keys = BTreeSet::new();
                for field in ["/data", "/stringData"] {
                    if let Some(m) = d.v.pointer(field).and_then(Value::as_object) {
                        keys.extend(m.keys().cloned());
                    }
                }
                keys
            })
    }

    fn configmap_value(&self, name: &str, key: &str) -> Option<&str> {
        self.find("ConfigMap", name)
            .and_then(|d| d.v.pointer("/data").and_then(Value::as_object))
            .and_then(|m| m.get(key))
            .and_then(Value::as_str)
    }

    /// The autoscaler's externalgrpc cloud-config, parsed.
    fn autoscaler_cloud_config(&self) -> Result<Value, String> {
        let a = self.autoscaler()?;
        let path = flag(&a.args(), "cloud-config")
            .ok_or("the autoscaler has no --cloud-config argument")?;
        match resolve_path(a.pod, a.container, &path)? {
            FileSource::ConfigMap { name, key } | FileSource::Secret { name, key } => {
                let text = self.configmap_value(&name, &key).ok_or_else(|| {
                    format!("autoscaler --cloud-config {path}: no ConfigMap {name} with key {key}")
                })?;
                parse_yaml(text)
                    .map_err(|e| format!("autoscaler cloud-config is not YAML: {e}"))?
                    .into_iter()
                    .next()
                    .ok_or_else(|| "autoscaler cloud-config is empty".to_string())
            }
        }
    }

    /// Whether the autoscaler of this set dials the provider of this set.
    fn autoscaler_dials_own_provider(&self) -> bool {
        self.has_provider() && self.has_autoscaler()
    }

    /// The provider's node groups (its --nodes).
    fn groups(&self) -> Vec<Result<Group, String>> {
        let Ok(p) = self.provider() else {
            return Vec::new();
        };
        flag_values(&p.args(), "nodes")
            .into_iter()
            .map(|spec| parse_group(&spec).ok_or(spec))
            .collect()
    }
}

/// Where a file inside a container comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FileSource {
    Secret { name: String, key: String },
    ConfigMap { name: String, key: String },
}

/// Follows a path given in a container's arguments to the Secret or ConfigMap key the kubelet
/// puts there: the volume mount holding the path, then the volume's items.
fn resolve_path(pod: &Value, container: &Value, path: &str) -> Result<FileSource, String> {
    let mount = arr_at(container, "/volumeMounts")
        .iter()
        .filter(|m| {
            let mp = str_at(m, "/mountPath").unwrap_or("");
            !mp.is_empty() && path.starts_with(&format!("{}/", mp.trim_end_matches('/')))
        })
        .max_by_key(|m| str_at(m, "/mountPath").unwrap_or("").len())
        .ok_or_else(|| format!("{path}: no volume is mounted at a directory holding it"))?;
    let mount_path = str_at(mount, "/mountPath").unwrap_or("");
    if mount.pointer("/subPath").is_some() {
        return Err(format!(
            "{path}: mounted with subPath, which never receives Secret updates"
        ));
    }
    let relative = &path[mount_path.trim_end_matches('/').len() + 1..];
    let volume_name = str_at(mount, "/name").unwrap_or("");
    let volume = arr_at(pod, "/volumes")
        .iter()
        .find(|v| str_at(v, "/name") == Some(volume_name))
        .ok_or_else(|| format!("{path}: volume {volume_name} is mounted but not defined"))?;

    let from_items = |source: &Value| -> Option<String> {
        let items = arr_at(source, "/items");
        if items.is_empty() {
            return Some(relative.to_string());
        }
        items
            .iter()
            .find(|i| str_at(i, "/path") == Some(relative))
            .and_then(|i| str_at(i, "/key"))
            .map(str::to_string)
    };
    let mut sources: Vec<(&str, &Value)> = Vec::new();
    if let Some(s) = volume.pointer("/secret") {
        sources.push(("Secret", s));
    }
    if let Some(s) = volume.pointer("/configMap") {
        sources.push(("ConfigMap", s));
    }
    for s in arr_at(volume, "/projected/sources") {
        if let Some(x) = s.pointer("/secret") {
            sources.push(("Secret", x));
        }
        if let Some(x) = s.pointer("/configMap") {
            sources.push(("ConfigMap", x));
        }
    }
    for (kind, source) in sources {
        let name = if kind == "Secret" && source.pointer("/secretName").is_some() {
            str_at(source, "/secretName")
        } else {
            str_at(source, "/name")
        }
        .unwrap_or("")
        .to_string();
        if let Some(key) = from_items(source) {
            return Ok(if kind == "Secret" {
                FileSource::Secret { name, key }
            } else {
                FileSource::ConfigMap { name, key }
            });
        }
    }
    Err(format!(
        "{path}: volume {volume_name} at {mount_path} puts nothing at {relative}"
    ))
}

/// The port number a probe or Service `targetPort` names, looked up in the container's ports.
fn container_port(container: &Value, port: &Value) -> Option<u64> {
    match port {
        Value::Number(n) => n.as_u64(),
        Value::String(name) => arr_at(container, "/ports")
            .iter()
            .find(|p| str_at(p, "/name") == Some(name))
            .and_then(|p| p.pointer("/containerPort"))
            .and_then(Value::as_u64),
        _ => None,
    }
}

fn service_port<'a>(service: &'a Doc, name: &str) -> Option<&'a Value> {
    arr_at(&service.v, "/spec/ports")
        .iter()
        .find(|p| str_at(p, "/name") == Some(name))
}

// ---------------------------------------------------------------------------------------------
// Checks on one rendered set

/// gRPC and metrics ports agree across the provider's flags, its container ports, its Services,
/// the probes and the autoscaler's `address`.
fn check_ports(s: &Set) -> Vec<String> {
    let mut problems = Vec::new();
    let p = match s.provider() {
        Ok(p) => p,
        Err(e) => return vec![e],
    };
    let args = p.args();
    let listen = flag(&args, "listen").and_then(|l| port_of(&l));
    let metrics = flag(&args, "metrics-listen").and_then(|l| port_of(&l));
    let (Some(listen), Some(metrics)) = (listen, metrics) else {
        return vec!["provider: --listen and --metrics-listen must be host:port".into()];
    };
    for (name, want) in [("grpc", listen), ("metrics", metrics)] {
        let got = container_port(p.container, &Value::String(name.into()));
        if got != Some(want) {
            problems.push(format!(
                "provider container port `{name}` is {got:?}, its flag listens on {want}"
            ));
        }
    }
    let svc = match s.provider_service() {
        Ok(svc) => svc,
        Err(e) => {
            problems.push(e);
            return problems;
        }
    };
    let mut grpc_service_port = None;
    for (name, want) in [("grpc", listen), ("metrics", metrics)] {
        match service_port(svc, name) {
            None => problems.push(format!("Service {} has no port `{name}`", svc.name())),
            Some(sp) => {
                let target = sp.pointer("/targetPort").or_else(|| sp.pointer("/port"));
                let got = target.and_then(|t| container_port(p.container, t));
                if got != Some(want) {
                    problems.push(format!(
                        "Service {} port `{name}` reaches container port {got:?}, the provider listens on {want}",
                        svc.name()
                    ));
                }
                if name == "grpc" {
                    grpc_service_port = sp.pointer("/port").and_then(Value::as_u64);
                }
            }
        }
    }
    // A Service for other clusters carries the gRPC port only: metrics stay inside.
    for ext in s.external_services() {
        for sp in arr_at(&ext.v, "/spec/ports") {
            let target = sp.pointer("/targetPort").or_else(|| sp.pointer("/port"));
            let got = target.and_then(|t| container_port(p.container, t));
            if got != Some(listen) {
                problems.push(format!(
                    "{}: port {} reaches container port {got:?}, not gRPC ({listen})",
                    ext.id(),
                    scalar(&sp["port"])
                ));
            }
        }
    }
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let Some(pr) = p.container.pointer(&format!("/{probe}")) else {
            problems.push(format!("provider has no {probe}"));
            continue;
        };
        if let Some(http) = pr.pointer("/httpGet") {
            let port = http
                .pointer("/port")
                .and_then(|x| container_port(p.container, x));
            if port != Some(metrics) {
                problems.push(format!(
                    "provider {probe} probes port {port:?}, the HTTP endpoints are on {metrics}"
                ));
            }
            if str_at(http, "/path") != Some(path) {
                problems.push(format!("provider {probe} must GET {path}"));
            }
        } else {
            problems.push(format!(
                "provider {probe} is not httpGet (the kubelet's gRPC probe cannot pass mTLS)"
            ));
        }
    }
    if s.autoscaler_dials_own_provider() {
        match s.autoscaler_cloud_config() {
            Err(e) => problems.push(e),
            Ok(cc) => {
                let address = str_at(&cc, "/address").unwrap_or("");
                let port = port_of(address);
                if port.is_none() || port != grpc_service_port {
                    problems.push(format!(
                        "autoscaler address {address:?} uses port {port:?}; Service {} serves gRPC on {grpc_service_port:?}",
                        svc.name()
                    ));
                }
            }
        }
    }
    problems
}

/// Every file the provider's flags name is mounted, from a Secret or ConfigMap key that exists
/// (certificates from one Secret, written by a Certificate when cert-manager issues them).
fn check_provider_mounts(s: &Set) -> Vec<String> {
    let mut problems = Vec::new();
    let p = match s.provider() {
        Ok(p) => p,
        Err(e) => return vec![e],
    };
    let args = p.args();
    let mut expect = vec![("cloud-config", None)];
    if flag(&args, "tls-cert").is_some() {
        expect.extend([
            ("tls-cert", Some("tls.crt")),
            ("tls-key", Some("tls.key")),
            ("tls-client-ca", Some("ca.crt")),
        ]);
    } else if flag(&args, "insecure").is_none() {
        problems.push("provider has neither --tls-cert nor --insecure".into());
    }
    for optional in ["cloudstack-ca", "config"] {
        if flag(&args, optional).is_some() {
            expect.push((optional, None));
        }
    }
    let mut tls_secrets = BTreeSet::new();
    for (name, want_key) in expect {
        let Some(path) = flag(&args, name) else {
            problems.push(format!("provider has no --{name}"));
            continue;
        };
        match resolve_path(p.pod, p.container, &path) {
            Err(e) => problems.push(format!("provider --{name}: {e}")),
            Ok(FileSource::ConfigMap { name: cm, key }) => {
                if matches!(
                    name,
                    "cloud-config" | "tls-cert" | "tls-key" | "tls-client-ca"
                ) {
                    problems.push(format!(
                        "provider --{name} {path} comes from ConfigMap {cm} key {key}; it must be a Secret"
                    ));
                } else if name == "config" && s.configmap_value(&cm, &key).is_none() {
                    problems.push(format!(
                        "provider --config {path}: no ConfigMap {cm} with key {key}"
                    ));
                }
            }
            Ok(FileSource::Secret { name: secret, key }) => {
                match s.secret_keys(&secret) {
                    Some(keys) if !keys.contains(&key) => problems.push(format!(
                        "provider --{name} {path}: Secret {secret} has no key {key} (it has {keys:?})"
                    )),
                    None if want_key.is_some() && s.uses_cert_manager() => problems.push(format!(
                        "provider --{name} {path}: Secret {secret} is written by no Certificate"
                    )),
                    _ => {}
                }
                if let Some(want) = want_key {
                    if key != want {
                        problems.push(format!(
                            "provider --{name} {path} is Secret {secret} key {key}, expected {want}"
                        ));
                    }
                    tls_secrets.insert(secret);
                }
            }
        }
    }
    if tls_secrets.len() > 1 {
        problems.push(format!(
            "provider --tls-cert, --tls-key and --tls-client-ca come from different Secrets {tls_secrets:?}"
        ));
    }
    problems
}

/// The autoscaler runs externalgrpc with a cloud-config whose client certificate paths are one
/// mounted Secret, whose address names the provider's Service (or, in a workload cluster, a
/// host outside it), with its status and lease in its own namespace.
fn check_autoscaler_wiring(s: &Set) -> Vec<String> {
    let mut problems = Vec::new();
    let a = match s.autoscaler() {
        Ok(a) => a,
        Err(e) => return vec![e],
    };
    let args = a.args();
    if !flag_values(&args, "nodes").is_empty() {
        problems.push(
            "autoscaler: --nodes has no effect with externalgrpc; the provider takes it".into(),
        );
    }
    // --namespace=$(POD_NAMESPACE) is expanded by the kubelet only from a variable the
    // container defines; the downward API gives it the pod's namespace.
    match flag(&args, "namespace").as_deref() {
        Some("$(POD_NAMESPACE)") => {
            let from_pod = arr_at(a.container, "/env").iter().any(|e| {
                str_at(e, "/name") == Some("POD_NAMESPACE")
                    && str_at(e, "/valueFrom/fieldRef/fieldPath") == Some("metadata.namespace")
            });
            if !from_pod {
                problems.push(
                    "autoscaler --namespace=$(POD_NAMESPACE) but POD_NAMESPACE is not the pod's namespace (fieldRef metadata.namespace)"
                        .into(),
                );
            }
        }
        other => problems.push(format!(
            "autoscaler --namespace is {other:?}: its status ConfigMap and lease would leave its namespace (default kube-system)"
        )),
    }
    let cc = match s.autoscaler_cloud_config() {
        Ok(cc) => cc,
        Err(e) => return vec![e],
    };
    let tls = str_at(&cc, "/cert").is_some();
    if !tls && !s.has_provider() {
        problems.push("autoscaler dials a provider in another cluster without TLS".into());
    }
    let mut client_secrets = BTreeSet::new();
    for (field, want_key) in [
        ("key", "tls.key"),
        ("cert", "tls.crt"),
        ("cacert", "ca.crt"),
    ] {
        let Some(path) = str_at(&cc, &format!("/{field}")) else {
            if tls {
                problems.push(format!("autoscaler cloud-config has no `{field}`"));
            }
            continue;
        };
        match resolve_path(a.pod, a.container, path) {
            Err(e) => problems.push(format!("autoscaler cloud-config `{field}`: {e}")),
            Ok(FileSource::ConfigMap { name, .. }) => problems.push(format!(
                "autoscaler cloud-config `{field}` {path} comes from ConfigMap {name}"
            )),
            Ok(FileSource::Secret { name, key }) => {
                if key != want_key {
                    problems.push(format!(
                        "autoscaler cloud-config `{field}` {path} is key {key} of {name}, expected {want_key}"
                    ));
                }
                if s.uses_cert_manager() {
                    match s.certificate_for_secret(&name) {
                        None => problems.push(format!(
                            "autoscaler cloud-config `{field}`: Secret {name} is not written by any Certificate"
                        )),
                        Some(c)
                            if !strings_at(&c.v, "/spec/usages")
                                .iter()
                                .any(|u| u == "client auth") =>
                        {
                            problems.push(format!("{} lacks the `client auth` usage", c.id()))
                        }
                        Some(_) => {}
                    }
                }
                client_secrets.insert(name);
            }
        }
    }
    if client_secrets.len() > 1 {
        problems.push(format!(
            "autoscaler key, cert and cacert come from different Secrets {client_secrets:?}"
        ));
    }
    let address = str_at(&cc, "/address").unwrap_or("");
    match (host_of(address), s.has_provider()) {
        (None, _) => problems.push(format!("autoscaler address {address:?} is not host:port")),
        (Some(host), true) => match s.provider_service() {
            Err(e) => problems.push(e),
            Ok(svc) => {
                let labels: Vec<&str> = host.split('.').collect();
                let ns = str_at(&svc.v, "/metadata/namespace").unwrap_or("");
                if labels[0] != svc.name() {
                    problems.push(format!(
                        "autoscaler address host {host} does not name Service {}",
                        svc.name()
                    ));
                }
                if labels.len() > 1 && labels[1] != ns {
                    problems.push(format!(
                        "autoscaler address host {host} is in namespace {}, the Service in {ns}",
                        labels[1]
                    ));
                }
                if labels.len() > 2 && labels[2] != "svc" {
                    problems.push(format!(
                        "autoscaler address host {host} is not a Service name"
                    ));
                }
            }
        },
        (Some(host), false) => {
            if host.ends_with(".svc") || host.ends_with(".svc.cluster.local") {
                problems.push(format!(
                    "autoscaler address host {host} is a Service of its own cluster, where no provider runs"
                ));
            }
        }
    }
    match str_at(&cc, "/grpc_timeout").map(go_duration_ms) {
        None => problems.push("autoscaler cloud-config has no grpc_timeout".into()),
        Some(None) => problems.push("autoscaler grpc_timeout is not a Go duration".into()),
        Some(Some(ms)) if ms < 5_000 => problems.push(format!(
            "autoscaler grpc_timeout {ms}ms is below the upstream default of 5s"
        )),
        Some(Some(_)) => {}
    }
    problems
}

/// The client identity an autoscaler claims (its pod annotation) and the names its client
/// certificate carries, when cert-manager issues it in this set.
fn autoscaler_identity(s: &Set) -> Result<(String, Option<Vec<String>>), String> {
    let a = s.autoscaler()?;
    let claimed = str_at(
        &a.doc.v,
        &format!(
            "/spec/template/metadata/annotations/{}",
            CLIENT_ANNOTATION.replace('/', "~1")
        ),
    )
    .ok_or_else(|| format!("autoscaler pod has no {CLIENT_ANNOTATION} annotation"))?
    .to_string();
    let cc = s.autoscaler_cloud_config()?;
    let names = str_at(&cc, "/cert")
        .and_then(|path| resolve_path(a.pod, a.container, path).ok())
        .and_then(|src| match src {
            FileSource::Secret { name, .. } => s.certificate_for_secret(&name),
            FileSource::ConfigMap { .. } => None,
        })
        .map(certificate_names);
    Ok((claimed, names))
}

/// A certificate's DNS names, then its common name: what the provider matches a client by.
fn certificate_names(c: &Doc) -> Vec<String> {
    let mut names = strings_at(&c.v, "/spec/dnsNames");
    names.extend(str_at(&c.v, "/spec/commonName").map(str::to_string));
    names
}

/// The server certificate covers the host the autoscaler dials and is issued by the same CA
/// every client certificate is; that CA issuer is backed by a CA Certificate.
fn check_tls(s: &Set) -> Vec<String> {
    let mut problems = Vec::new();
    let p = match s.provider() {
        Ok(p) => p,
        Err(e) => return vec![e],
    };
    if flag(&p.args(), "tls-cert").is_none() || !s.uses_cert_manager() {
        return problems;
    }
    let server_secret = match flag(&p.args(), "tls-cert")
        .ok_or_else(|| "provider has no --tls-cert".to_string())
        .and_then(|path| resolve_path(p.pod, p.container, &path))
    {
        Ok(FileSource::Secret { name, .. }) => name,
        Ok(other) => return vec![format!("provider --tls-cert comes from {other:?}")],
        Err(e) => return vec![e],
    };
    let Some(server) = s.certificate_for_secret(&server_secret) else {
        return vec![format!(
            "no Certificate writes the provider's Secret {server_secret}"
        )];
    };
    if !strings_at(&server.v, "/spec/usages")
        .iter()
        .any(|u| u == "server auth")
    {
        problems.push(format!("{} lacks the `server auth` usage", server.id()));
    }
    if s.autoscaler_dials_own_provider() {
        match s.autoscaler_cloud_config() {
            Err(e) => problems.push(e),
            Ok(cc) => {
                let address = str_at(&cc, "/address").unwrap_or("");
                let dns = strings_at(&server.v, "/spec/dnsNames");
                match host_of(address) {
                    Some(host) if dns.iter().any(|d| d == host) => {}
                    host => problems.push(format!(
                        "{} dnsNames {dns:?} do not include {host:?}, the host the autoscaler verifies",
                        server.id()
                    )),
                }
            }
        }
    }
    // Every client certificate must chain to the CA the provider trusts (its ca.crt is the
    // issuer's CA).
    for client in s.of_kind("Certificate").filter(|c| {
        strings_at(&c.v, "/spec/usages")
            .iter()
            .any(|u| u == "client auth")
    }) {
        if server.v.pointer("/spec/issuerRef") != client.v.pointer("/spec/issuerRef") {
            problems.push(format!(
                "{} and {} come from different issuers: neither side would trust the other",
                server.id(),
                client.id()
            ));
        }
    }
    // Follow issuerRefs: every Issuer exists; a CA issuer's secret is written by an isCA
    // Certificate.
    for cert in s.of_kind("Certificate") {
        let kind = str_at(&cert.v, "/spec/issuerRef/kind").unwrap_or("Issuer");
        let name = str_at(&cert.v, "/spec/issuerRef/name").unwrap_or("");
        let Some(issuer) = s.find(kind, name) else {
            problems.push(format!(
                "{}: issuer {kind} {name} does not exist",
                cert.id()
            ));
            continue;
        };
        if let Some(ca_secret) = str_at(&issuer.v, "/spec/ca/secretName") {
            let backed = s.of_kind("Certificate").any(|c| {
                str_at(&c.v, "/spec/secretName") == Some(ca_secret)
                    && c.v.pointer("/spec/isCA") == Some(&Value::Bool(true))
            });
            if !backed {
                problems.push(format!(
                    "{}: CA secret {ca_secret} is not written by an isCA Certificate",
                    issuer.id()
                ));
            }
        }
    }
    problems
}

/// `--nodes …@CLIENT`: with more than one cluster every group names its client and client
/// certificates are required, as `serve` demands; every client named has a client certificate
/// carrying that name from the CA the provider trusts; the autoscaler of the set carries the
/// identity it claims.
fn check_client_binding(s: &Set) -> Vec<String> {
    let mut problems = Vec::new();
    let p = match s.provider() {
        Ok(p) => p,
        Err(e) => return vec![e],
    };
    let mut groups = Vec::new();
    for g in s.groups() {
        match g {
            Ok(g) => groups.push(g),
            Err(spec) => problems.push(format!(
                "provider --nodes={spec} is not MIN:MAX:CLUSTER[@CLIENT]"
            )),
        }
    }
    if groups.is_empty() {
        problems.push("provider has no --nodes".into());
    }
    let clusters: BTreeSet<&str> = groups.iter().map(|g| g.cluster.as_str()).collect();
    if clusters.len() > 1 {
        for g in groups.iter().filter(|g| g.client.is_none()) {
            problems.push(format!(
                "cluster {} has no @CLIENT with {} clusters on one provider: every client would see and scale it",
                g.cluster,
                clusters.len()
            ));
        }
        if flag(&p.args(), "tls-client-ca").is_none() {
            problems.push(format!(
                "{} clusters but no --tls-client-ca: client binding needs verified client certificates",
                clusters.len()
            ));
        }
    }
    if s.uses_cert_manager() {
        let issuer_of_server = flag(&p.args(), "tls-cert")
            .and_then(|path| resolve_path(p.pod, p.container, &path).ok())
            .and_then(|src| match src {
                FileSource::Secret { name, .. } => s.certificate_for_secret(&name),
                FileSource::ConfigMap { .. } => None,
            })
            .and_then(|c| c.v.pointer("/spec/issuerRef").cloned());
        for client in groups.iter().filter_map(|g| g.client.as_deref()) {
            let issued = s.of_kind("Certificate").any(|c| {
                certificate_names(c).iter().any(|n| n == client)
                    && strings_at(&c.v, "/spec/usages")
                        .iter()
                        .any(|u| u == "client auth")
                    && c.v.pointer("/spec/issuerRef").cloned() == issuer_of_server
            });
            if !issued {
                problems.push(format!(
                    "--nodes …@{client}: no client certificate for {client} from the provider's CA"
                ));
            }
        }
    }
    if s.has_autoscaler() {
        match autoscaler_identity(s) {
            Err(e) => problems.push(e),
            Ok((claimed, Some(names))) if !names.contains(&claimed) => problems.push(format!(
                "autoscaler claims client {claimed} but its certificate names {names:?}"
            )),
            Ok(_) => {}
        }
    }
    problems
}

/// Both pods run non-root with a read-only root filesystem, no privilege escalation, no
/// capabilities, the RuntimeDefault seccomp profile, read-only mounts the user can read, and
/// resource requests and memory limits.
fn check_security(s: &Set) -> Vec<String> {
    let mut problems = Vec::new();
    for d in s.of_kind("Deployment") {
        let pod = d.v.pointer("/spec/template/spec").unwrap_or(&Value::Null);
        let psc = pod.pointer("/securityContext").unwrap_or(&Value::Null);
        let id = d.id();
        if psc.pointer("/runAsNonRoot") != Some(&Value::Bool(true)) {
            problems.push(format!(
                "{id}: pod securityContext.runAsNonRoot is not true"
            ));
        }
        let uid = psc.pointer("/runAsUser").and_then(Value::as_u64);
        if uid == Some(0) || uid.is_none() {
            problems.push(format!("{id}: pod runAsUser must be a non-zero uid"));
        }
        if str_at(psc, "/seccompProfile/type") != Some("RuntimeDefault") {
            problems.push(format!("{id}: pod seccompProfile is not RuntimeDefault"));
        }
        let fs_group = psc.pointer("/fsGroup").and_then(Value::as_u64);
        for v in arr_at(pod, "/volumes") {
            if v.pointer("/hostPath").is_some() {
                problems.push(format!("{id}: hostPath volume {}", scalar(&v["name"])));
            }
            // A non-root process reads a Secret file only through the group (fsGroup) or
            // "other" bits; the kubelet's default mode is 0644.
            let secret_modes = |source: &Value| -> Vec<u64> {
                let mut modes = vec![
                    source
                        .pointer("/defaultMode")
                        .and_then(Value::as_u64)
                        .unwrap_or(0o644),
                ];
                modes.extend(
                    arr_at(source, "/items")
                        .iter()
                        .filter_map(|i| i.pointer("/mode").and_then(Value::as_u64)),
                );
                modes
            };
            let mut modes = Vec::new();
            if let Some(secret) = v.pointer("/secret") {
                modes.extend(secret_modes(secret));
            }
            if let Some(projected) = v.pointer("/projected") {
                modes.extend(secret_modes(projected));
            }
            for mode in modes {
                let readable = mode & 0o004 != 0 || (fs_group.is_some() && mode & 0o040 != 0);
                if !readable {
                    problems.push(format!(
                        "{id}: volume {} mode {mode:o} is unreadable for uid {uid:?} (fsGroup {fs_group:?})",
                        scalar(&v["name"])
                    ));
                }
            }
        }
        for c in arr_at(pod, "/containers") {
            let cname = str_at(c, "/name").unwrap_or("");
            let sc = c.pointer("/securityContext").unwrap_or(&Value::Null);
            if sc.pointer("/readOnlyRootFilesystem") != Some(&Value::Bool(true)) {
                problems.push(format!("{id} {cname}: readOnlyRootFilesystem is not true"));
            }
            if sc.pointer("/allowPrivilegeEscalation") != Some(&Value::Bool(false)) {
                problems.push(format!(
                    "{id} {cname}: allowPrivilegeEscalation is not false"
                ));
            }
            if sc.pointer("/privileged") == Some(&Value::Bool(true)) {
                problems.push(format!("{id} {cname}: privileged"));
            }
            if sc.pointer("/runAsUser").and_then(Value::as_u64) == Some(0)
                || sc.pointer("/runAsNonRoot") == Some(&Value::Bool(false))
            {
                problems.push(format!("{id} {cname}: container overrides to root"));
            }
            if !strings_at(sc, "/capabilities/drop")
                .iter()
                .any(|c| c == "ALL")
            {
                problems.push(format!("{id} {cname}: capabilities.drop lacks ALL"));
            }
            if !arr_at(sc, "/capabilities/add").is_empty() {
                problems.push(format!("{id} {cname}: adds capabilities"));
            }
            // The one writable mount allowed: the directory of the provider's --state-file, on
            // a volume of the pod's own (emptyDir) or a claim, never the node's disk.
            let state_dir = strings_at(c, "/args").iter().find_map(|a| {
                a.strip_prefix("--state-file=")
                    .and_then(|f| f.rsplit_once('/'))
                    .map(|(dir, _)| dir.to_string())
            });
            for m in arr_at(c, "/volumeMounts") {
                let writable_state = state_dir.as_deref() == str_at(m, "/mountPath")
                    && arr_at(pod, "/volumes").iter().any(|v| {
                        v["name"] == m["name"]
                            && (v.pointer("/emptyDir").is_some()
                                || v.pointer("/persistentVolumeClaim").is_some())
                    });
                if m.pointer("/readOnly") != Some(&Value::Bool(true)) && !writable_state {
                    problems.push(format!(
                        "{id} {cname}: mount {} is not readOnly",
                        scalar(&m["mountPath"])
                    ));
                }
                if m.pointer("/subPath").is_some() {
                    problems.push(format!(
                        "{id} {cname}: mount {} uses subPath (no updates on rotation)",
                        scalar(&m["mountPath"])
                    ));
                }
            }
            for r in [
                "/resources/requests/cpu",
                "/resources/requests/memory",
                "/resources/limits/memory",
            ] {
                if c.pointer(r).is_none() {
                    problems.push(format!("{id} {cname}: no {r}"));
                }
            }
        }
    }
    // The provider calls the Kubernetes API only for --state-configmap and
    // --confirm-node-marks: a token in its pod then, and only then.
    if let Ok(p) = s.provider() {
        let args = p.args();
        let wanted = flag(&args, "state-configmap").is_some()
            || args.iter().any(|a| a == "--confirm-node-marks");
        if p.pod.pointer("/automountServiceAccountToken") != Some(&Value::Bool(wanted)) {
            problems.push(format!(
                "provider pod: automountServiceAccountToken is not {wanted} (the token is for --state-configmap and --confirm-node-marks only)"
            ));
        }
    }
    problems
}

/// With `--confirm-node-marks` the provider's ServiceAccount is bound to a ClusterRole that
/// grants get on nodes and nothing else; without it, to no ClusterRole. A real API server
/// checks the ClusterRole is enough (tests/it/node_marks.rs).
fn check_provider_node_rbac(s: &Set) -> Vec<String> {
    let mut problems = Vec::new();
    let Ok(p) = s.provider() else {
        return problems;
    };
    let sa = str_at(p.pod, "/serviceAccountName").unwrap_or("default");
    let ns = str_at(&p.doc.v, "/metadata/namespace").unwrap_or("");
    let roles: Vec<&Doc> = s
        .of_kind("ClusterRoleBinding")
        .filter(|b| {
            arr_at(&b.v, "/subjects").iter().any(|subject| {
                str_at(subject, "/kind") == Some("ServiceAccount")
                    && str_at(subject, "/name") == Some(sa)
                    && str_at(subject, "/namespace") == Some(ns)
            })
        })
        .filter_map(|b| s.find("ClusterRole", str_at(&b.v, "/roleRef/name").unwrap_or("")))
        .collect();
    let wanted = p.args().iter().any(|a| a == "--confirm-node-marks");
    if !wanted {
        if !roles.is_empty() {
            problems.push(format!(
                "the provider's ServiceAccount {sa} is bound to a ClusterRole without --confirm-node-marks"
            ));
        }
        return problems;
    }
    let gets_nodes = roles.iter().any(|r| {
        arr_at(&r.v, "/rules").iter().any(|rule| {
            strings_at(rule, "/resources").iter().any(|x| x == "nodes")
                && strings_at(rule, "/verbs").iter().any(|x| x == "get")
        })
    });
    if !gets_nodes {
        problems.push(format!(
            "--confirm-node-marks, and no ClusterRole bound to the provider's ServiceAccount {sa} lets it get nodes"
        ));
    }
    for r in &roles {
        for rule in arr_at(&r.v, "/rules") {
            if strings_at(rule, "/resources") != ["nodes"] || strings_at(rule, "/verbs") != ["get"]
            {
                problems.push(format!(
                    "{}: the provider's ClusterRole grants more than get on nodes",
                    r.id()
                ));
            }
        }
    }
    problems
}

/// With `--state-configmap=NAME` the provider's ServiceAccount is bound to a Role of its own
/// namespace that grants get and update on NAME and create on ConfigMaps; with `--leader-elect`
/// also get and update on its Lease, create on Leases, get and patch on pods (its own pod's role
/// label), and nothing more on those; nothing beyond ConfigMaps without it, no Role at all
/// without `--state-configmap`. A real API server checks the Role is enough
/// (tests/it/kube_store.rs).
fn check_provider_rbac(s: &Set) -> Vec<String> {
    let mut problems = Vec::new();
    let Ok(p) = s.provider() else {
        return problems;
    };
    let sa = str_at(p.pod, "/serviceAccountName").unwrap_or("default");
    let ns = str_at(&p.doc.v, "/metadata/namespace").unwrap_or("");
    let roles: Vec<&Doc> = s
        .of_kind("RoleBinding")
        .filter(|b| {
            arr_at(&b.v, "/subjects").iter().any(|subject| {
                str_at(subject, "/kind") == Some("ServiceAccount")
                    && str_at(subject, "/name") == Some(sa)
                    && str_at(subject, "/namespace") == Some(ns)
            })
        })
        .filter_map(|b| s.find("Role", str_at(&b.v, "/roleRef/name").unwrap_or("")))
        .collect();
    let Some(name) = flag(&p.args(), "state-configmap") else {
        if !roles.is_empty() {
            problems.push(format!(
                "the provider's ServiceAccount {sa} is bound to a Role without --state-configmap"
            ));
        }
        return problems;
    };
    let grants = |verb: &str, named: bool| {
        roles.iter().any(|r| {
            arr_at(&r.v, "/rules").iter().any(|rule| {
                let names = strings_at(rule, "/resourceNames");
                strings_at(rule, "/resources")
                    .iter()
                    .any(|x| x == "configmaps")
                    && strings_at(rule, "/verbs").iter().any(|x| x == verb)
                    && (names.is_empty() || (named && names.contains(&name)))
            })
        })
    };
    for (verb, named) in [("get", true), ("update", true), ("create", false)] {
        if !grants(verb, named) {
            problems.push(format!(
                "no Role bound to the provider's ServiceAccount {sa} lets it {verb} configmap {name}"
            ));
        }
    }
    let leader_elect = p.leader_elect();
    if leader_elect {
        let lease = flag(&p.args(), "leader-elect-resource-name")
            .unwrap_or_else(|| DEFAULT_LEASE.to_string());
        let grants = |group: &str, resource: &str, verb: &str, name: Option<&str>| {
            roles.iter().any(|r| {
                arr_at(&r.v, "/rules").iter().any(|rule| {
                    let names = strings_at(rule, "/resourceNames");
                    strings_at(rule, "/apiGroups").iter().any(|g| g == group)
                        && strings_at(rule, "/resources").iter().any(|x| x == resource)
                        && strings_at(rule, "/verbs").iter().any(|x| x == verb)
                        && (names.is_empty() || name.is_some_and(|n| names.iter().any(|x| x == n)))
                })
            })
        };
        for (group, resource, verb, name) in [
            ("coordination.k8s.io", "leases", "get", Some(lease.as_str())),
            (
                "coordination.k8s.io",
                "leases",
                "update",
                Some(lease.as_str()),
            ),
            ("coordination.k8s.io", "leases", "create", None),
            ("", "pods", "get", None),
            ("", "pods", "patch", None),
        ] {
            if !grants(group, resource, verb, name) {
                problems.push(format!(
                    "--leader-elect, and no Role bound to the provider's ServiceAccount {sa} lets it {verb} {resource} {}",
                    name.unwrap_or("")
                ));
            }
        }
    }
    for r in &roles {
        for rule in arr_at(&r.v, "/rules") {
            let resources = strings_at(rule, "/resources");
            let verbs = strings_at(rule, "/verbs");
            let allowed: &[&str] = match resources.as_slice() {
                [one] if one == "configmaps" => continue,
                [one] if one == "leases" && leader_elect => &["get", "create", "update"],
                [one] if one == "pods" && leader_elect => &["get", "patch"],
                _ => {
                    problems.push(format!(
                        "{}: the provider's Role grants {resources:?}, beyond ConfigMaps{}",
                        r.id(),
                        if leader_elect {
                            " and, for --leader-elect, Leases and pods"
                        } else {
                            " (no --leader-elect)"
                        }
                    ));
                    continue;
                }
            };
            if let Some(v) = verbs.iter().find(|v| !allowed.contains(&v.as_str())) {
                problems.push(format!(
                    "{}: the provider's Role grants {v} on {resources:?}, beyond {allowed:?}",
                    r.id()
                ));
            }
        }
    }
    problems
}

/// The provider's replicas: more than one only with `--leader-elect`, which needs
/// `--state-configmap` (the replicas share the ledger) and the pod's name and namespace from the
/// downward API; every Service reaching the provider selects the label the leader gives its own
/// pod (a standby answers UNAVAILABLE); several replicas roll one at a time, spread over nodes,
/// and keep one through disruptions (minAvailable 1). One replica without leader election,
/// replaced with Recreate (two providers would both act on the same clusters).
fn check_replicas(s: &Set) -> Vec<String> {
    let mut problems = Vec::new();
    let Ok(p) = s.provider() else {
        return problems;
    };
    let replicas = p.replicas();
    let strategy = str_at(&p.doc.v, "/spec/strategy/type").unwrap_or("RollingUpdate");
    let labels = p.pod_labels();
    let services: Vec<&Doc> = s
        .of_kind("Service")
        .filter(|svc| {
            let sel = labels_at(&svc.v, "/spec/selector");
            let mut without_role = sel.clone();
            without_role.remove(LEADER_LABEL.0);
            !sel.is_empty() && selects(&without_role, &labels)
        })
        .collect();
    if !p.leader_elect() {
        if replicas != 1 {
            problems.push(format!(
                "{}: {replicas} replicas without --leader-elect: they would all act on the same clusters",
                p.doc.id()
            ));
        }
        if strategy != "Recreate" {
            problems.push(format!(
                "{}: strategy {strategy} without --leader-elect: a rollout runs two providers acting on the same clusters",
                p.doc.id()
            ));
        }
        for svc in services {
            if labels_at(&svc.v, "/spec/selector").contains_key(LEADER_LABEL.0) {
                problems.push(format!(
                    "{}: selects {}, which no pod carries without --leader-elect",
                    svc.id(),
                    LEADER_LABEL.0
                ));
            }
        }
        return problems;
    }
    let args = p.args();
    if flag(&args, "state-configmap").is_none() {
        problems.push("--leader-elect without --state-configmap: serve refuses it".into());
    }
    for (var, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        let from_field = arr_at(p.container, "/env").iter().any(|e| {
            str_at(e, "/name") == Some(var)
                && str_at(e, "/valueFrom/fieldRef/fieldPath") == Some(field)
        });
        if !from_field {
            problems.push(format!(
                "--leader-elect, and the container's {var} is not the downward API's {field}"
            ));
        }
    }
    if services.is_empty() {
        problems.push("no Service reaches the provider".into());
    }
    for svc in services {
        let sel = labels_at(&svc.v, "/spec/selector");
        if sel.get(LEADER_LABEL.0).map(String::as_str) != Some(LEADER_LABEL.1) {
            problems.push(format!(
                "{}: does not select {}={}: autoscalers reach a standby, which answers UNAVAILABLE",
                svc.id(),
                LEADER_LABEL.0,
                LEADER_LABEL.1
            ));
        }
    }
    if replicas > 1 {
        let max_unavailable = p
            .doc
            .v
            .pointer("/spec/strategy/rollingUpdate/maxUnavailable")
            .and_then(Value::as_u64);
        if strategy != "RollingUpdate" || max_unavailable.is_none_or(|m| m >= replicas) {
            problems.push(format!(
                "{}: {replicas} replicas with strategy {strategy}, maxUnavailable {max_unavailable:?}: a rollout stops them all at once",
                p.doc.id()
            ));
        }
        let spread = arr_at(
            p.pod,
            "/affinity/podAntiAffinity/preferredDuringSchedulingIgnoredDuringExecution",
        )
        .iter()
        .map(|t| t.pointer("/podAffinityTerm").unwrap_or(&Value::Null))
        .chain(arr_at(
            p.pod,
            "/affinity/podAntiAffinity/requiredDuringSchedulingIgnoredDuringExecution",
        ))
        .any(|term| {
            str_at(term, "/topologyKey") == Some("kubernetes.io/hostname")
                && selects(&labels_at(term, "/labelSelector/matchLabels"), &labels)
        });
        if !spread {
            problems.push(format!(
                "{}: {replicas} replicas and no podAntiAffinity over kubernetes.io/hostname: both may run on one node",
                p.doc.id()
            ));
        }
        for b in s
            .of_kind("PodDisruptionBudget")
            .filter(|b| selects(&labels_at(&b.v, "/spec/selector/matchLabels"), &labels))
        {
            if b.v.pointer("/spec/minAvailable").and_then(Value::as_u64) != Some(1) {
                problems.push(format!(
                    "{}: {replicas} replicas, and not minAvailable 1",
                    b.id()
                ));
            }
        }
    }
    problems
}

/// Images are pinned to a tag (or digest) that is not `latest`; the provider runs the crate's
/// own version.
fn check_images(s: &Set) -> Vec<String> {
    let mut problems = Vec::new();
    for d in s.of_kind("Deployment") {
        for c in arr_at(&d.v, "/spec/template/spec/containers") {
            let image = str_at(c, "/image").unwrap_or("");
            let pinned =
                image.contains("@sha256:") || image_tag(image).is_some_and(|t| t != "latest");
            if !pinned {
                problems.push(format!(
                    "{}: image {image:?} is not pinned to a tag",
                    d.id()
                ));
            }
            if str_at(c, "/imagePullPolicy") == Some("Always") {
                problems.push(format!(
                    "{}: imagePullPolicy Always with a pinned tag",
                    d.id()
                ));
            }
        }
    }
    if let Ok(p) = s.provider() {
        let image = str_at(p.container, "/image").unwrap_or("");
        let want = env!("CARGO_PKG_VERSION");
        // By digest, which build it is is the operator's to know.
        if !image.contains("@sha256:") && image_tag(image) != Some(want) {
            problems.push(format!(
                "provider image {image} does not carry the crate version {want}"
            ));
        }
    }
    problems
}

/// A Helm provider runs the image its values name: `image.repository`, then `@image.digest`
/// when one is set (the tag ignored), else `:image.tag` or the chart's appVersion (the crate's
/// version).
fn check_provider_image(s: &Set) -> Vec<String> {
    let p = match s.provider() {
        Ok(p) => p,
        Err(e) => return vec![e],
    };
    let image = str_at(p.container, "/image").unwrap_or("");
    let value = |pointer: &str| {
        s.values
            .pointer(pointer)
            .filter(|v| !v.is_null())
            .map(scalar)
            .filter(|v| !v.is_empty())
    };
    let Some(repository) = value("/image/repository") else {
        return vec![format!(
            "provider image {image} rendered from values without image.repository, which the chart must refuse"
        )];
    };
    let want = match value("/image/digest") {
        Some(digest) => format!("{repository}@{digest}"),
        None => format!(
            "{repository}:{}",
            value("/image/tag").unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_string())
        ),
    };
    if image == want {
        vec![]
    } else {
        vec![format!("provider image {image}, its values name {want}")]
    }
}

/// No public provider image exists, so the chart renders nothing without `image.repository`:
/// values that name clusters but no image were tried, and refused for naming no image.
fn check_image_refusal(refusals: &[Refusal]) -> Vec<String> {
    let no_image: Vec<&Refusal> = refusals
        .iter()
        .filter(|r| {
            r.values.pointer("/image/repository").is_none()
                && !arr_at(&r.values, "/nodes").is_empty()
        })
        .collect();
    if no_image.is_empty() {
        return vec!["no refusal was tried with clusters and no image.repository".into()];
    }
    no_image
        .into_iter()
        .filter(|r| !(r.refused && r.message.contains("image.repository")))
        .map(|r| {
            if r.refused {
                format!(
                    "{}: refused without naming image.repository: {}",
                    r.what, r.message
                )
            } else {
                format!("{}: rendered without image.repository", r.what)
            }
        })
        .collect()
}

/// The NetworkPolicy admits to the gRPC port only the autoscaler's pods and, for a central
/// provider, address blocks of the workload clusters; to the metrics port, only a selected
/// monitoring peer.
fn check_network_policy(s: &Set) -> Vec<String> {
    let mut problems = Vec::new();
    let p = match s.provider() {
        Ok(p) => p,
        Err(e) => return vec![e],
    };
    let args = p.args();
    let listen = flag(&args, "listen").and_then(|l| port_of(&l));
    let metrics = flag(&args, "metrics-listen").and_then(|l| port_of(&l));
    let provider_labels = p.pod_labels();
    let autoscaler_labels = s.autoscaler().ok().map(|a| a.pod_labels());
    let policies: Vec<&Doc> = s
        .of_kind("NetworkPolicy")
        .filter(|np| {
            selects(
                &labels_at(&np.v, "/spec/podSelector/matchLabels"),
                &provider_labels,
            )
        })
        .collect();
    if policies.is_empty() {
        return vec![format!(
            "{}: no NetworkPolicy selects the provider's pods",
            s.name
        )];
    }
    let mut grpc_admits_autoscaler = false;
    let mut grpc_admits_blocks = false;
    let mut metrics_admitted = false;
    for np in policies {
        if !strings_at(&np.v, "/spec/policyTypes")
            .iter()
            .any(|t| t == "Ingress")
        {
            problems.push(format!("{}: policyTypes lacks Ingress", np.id()));
        }
        for rule in arr_at(&np.v, "/spec/ingress") {
            let ports: Vec<Option<u64>> = arr_at(rule, "/ports")
                .iter()
                .map(|pt| {
                    pt.pointer("/port")
                        .and_then(|x| container_port(p.container, x))
                })
                .collect();
            let all_ports = ports.is_empty();
            let covers = |port: Option<u64>| all_ports || ports.contains(&port);
            let peers = arr_at(rule, "/from");
            if covers(listen) {
                if peers.is_empty() {
                    problems.push(format!(
                        "{}: a rule opens the gRPC port to everyone",
                        np.id()
                    ));
                }
                for peer in peers {
                    let sel = labels_at(peer, "/podSelector/matchLabels");
                    let is_autoscaler = peer.pointer("/namespaceSelector").is_none()
                        && peer.pointer("/ipBlock").is_none()
                        && autoscaler_labels
                            .as_ref()
                            .is_some_and(|labels| selects(&sel, labels));
                    let block = str_at(peer, "/ipBlock/cidr");
                    if is_autoscaler {
                        grpc_admits_autoscaler = true;
                    } else if block.is_some_and(|c| !c.ends_with("/0")) {
                        grpc_admits_blocks = true;
                    } else {
                        problems.push(format!(
                            "{}: the gRPC port is open to {peer} besides the autoscaler and the workload clusters' address blocks",
                            np.id()
                        ));
                    }
                }
            }
            if !all_ports && ports.contains(&metrics) {
                metrics_admitted = true;
                if peers.is_empty() {
                    problems.push(format!("{}: the metrics port is open to everyone", np.id()));
                }
                for peer in peers {
                    let selective = |ptr: &str| {
                        peer.pointer(ptr).is_some_and(|s| {
                            !labels_at(s, "/matchLabels").is_empty()
                                || !arr_at(s, "/matchExpressions").is_empty()
                        })
                    };
                    if !(selective("/podSelector")
                        || selective("/namespaceSelector")
                        || peer.pointer("/ipBlock").is_some())
                    {
                        problems.push(format!(
                            "{}: the metrics port is open to all pods ({peer})",
                            np.id()
                        ));
                    }
                }
            }
            for port in &ports {
                if *port != listen && *port != metrics {
                    problems.push(format!(
                        "{}: admits port {port:?}, which the provider does not serve",
                        np.id()
                    ));
                }
            }
        }
    }
    match &autoscaler_labels {
        Some(labels) if !grpc_admits_autoscaler => problems.push(format!(
            "no NetworkPolicy rule admits the autoscaler ({labels:?}) to gRPC port {listen:?}"
        )),
        None if !grpc_admits_blocks => problems.push(format!(
            "no autoscaler in this cluster and no NetworkPolicy rule admits any other to gRPC port {listen:?}"
        )),
        _ => {}
    }
    if !metrics_admitted {
        problems.push(format!(
            "no NetworkPolicy rule admits Prometheus to metrics port {metrics:?}"
        ));
    }
    problems
}

/// Selectors select their own pods (Deployments, Services, PodDisruptionBudgets), service
/// accounts exist, RBAC bindings point at existing roles and the autoscaler's account, and the
/// roles grant what leader election, the status ConfigMap and the releases' watches need.
fn check_identity(s: &Set) -> Vec<String> {
    let mut problems = Vec::new();
    let external_sa = s
        .values
        .pointer("/autoscaler/serviceAccount/create")
        .and_then(Value::as_bool)
        == Some(false);
    for d in s.of_kind("Deployment") {
        let sel = labels_at(&d.v, "/spec/selector/matchLabels");
        let labels = labels_at(&d.v, "/spec/template/metadata/labels");
        if !selects(&sel, &labels) {
            problems.push(format!(
                "{}: selector does not match its pod labels",
                d.id()
            ));
        }
        let sa = str_at(&d.v, "/spec/template/spec/serviceAccountName").unwrap_or("default");
        let is_autoscaler = s.autoscaler().is_ok_and(|a| a.doc.name() == d.name());
        if s.find("ServiceAccount", sa).is_none() && !(is_autoscaler && external_sa) {
            problems.push(format!("{}: ServiceAccount {sa} does not exist", d.id()));
        }
        let budgets = s
            .of_kind("PodDisruptionBudget")
            .filter(|b| selects(&labels_at(&b.v, "/spec/selector/matchLabels"), &labels))
            .count();
        let wanted = if d.name()
            == s.provider()
                .map(|p| p.doc.name().to_string())
                .unwrap_or_default()
        {
            s.values.pointer("/podDisruptionBudget/enabled")
        } else {
            s.values.pointer("/autoscaler/podDisruptionBudget/enabled")
        } != Some(&Value::Bool(false));
        if wanted && budgets != 1 {
            problems.push(format!(
                "{}: {budgets} PodDisruptionBudgets select its pods; one lets the autoscaler drain the node it runs on",
                d.id()
            ));
        }
    }
    for b in s.of_kind("PodDisruptionBudget") {
        let sel = labels_at(&b.v, "/spec/selector/matchLabels");
        if !s
            .of_kind("Deployment")
            .any(|d| selects(&sel, &labels_at(&d.v, "/spec/template/metadata/labels")))
        {
            problems.push(format!("{}: selects no Deployment's pods", b.id()));
        }
    }
    if let (Ok(svc), Ok(a)) = (s.provider_service(), s.autoscaler())
        && selects(&labels_at(&svc.v, "/spec/selector"), &a.pod_labels())
    {
        problems.push(format!(
            "Service {} also selects the autoscaler",
            svc.name()
        ));
    }
    let Ok(a) = s.autoscaler() else {
        return problems;
    };
    let ns = str_at(&a.doc.v, "/metadata/namespace").unwrap_or("");
    let sa = str_at(a.pod, "/serviceAccountName").unwrap_or("default");
    let mut bound = BTreeSet::new();
    let bindings: Vec<&Doc> = s
        .of_kind("ClusterRoleBinding")
        .chain(s.of_kind("RoleBinding"))
        .collect();
    let binds_autoscaler = |b: &&Doc| {
        arr_at(&b.v, "/subjects")
            .iter()
            .any(|subject| str_at(subject, "/name") == Some(sa))
    };
    if !bindings.iter().any(binds_autoscaler) {
        // autoscaler.rbac.create=false: the operator binds the account (the provider's own
        // binding is check_provider_rbac's).
        return problems;
    }
    for binding in bindings {
        let kind = str_at(&binding.v, "/roleRef/kind").unwrap_or("");
        let name = str_at(&binding.v, "/roleRef/name").unwrap_or("");
        if s.find(kind, name).is_none() {
            problems.push(format!(
                "{}: roleRef {kind} {name} does not exist",
                binding.id()
            ));
        }
        for subject in arr_at(&binding.v, "/subjects") {
            if str_at(subject, "/kind") == Some("ServiceAccount")
                && str_at(subject, "/name") == Some(sa)
            {
                match str_at(subject, "/namespace") {
                    Some(sns) if sns == ns => {}
                    other => problems.push(format!(
                        "{}: subject {sa} in namespace {other:?}, the autoscaler runs in {ns}",
                        binding.id()
                    )),
                }
                bound.insert(kind.to_string());
            }
        }
    }
    for kind in ["ClusterRole", "Role"] {
        if !bound.contains(kind) {
            problems.push(format!(
                "the autoscaler's ServiceAccount {sa} is bound to no {kind}"
            ));
        }
    }
    for role in s.of_kind("Role") {
        if str_at(&role.v, "/metadata/namespace") != Some(ns) {
            problems.push(format!(
                "{}: not in {ns}, where the autoscaler keeps its status ConfigMap (--namespace)",
                role.id()
            ));
        }
    }
    let grants = |kind: &str, resource: &str, resource_name: Option<&str>, verb: &str| {
        s.of_kind(kind).any(|r| {
            arr_at(&r.v, "/rules").iter().any(|rule| {
                strings_at(rule, "/resources").iter().any(|x| x == resource)
                    && strings_at(rule, "/verbs").iter().any(|x| x == verb)
                    && resource_name.is_none_or(|n| {
                        let names = strings_at(rule, "/resourceNames");
                        names.is_empty() || names.iter().any(|x| x == n)
                    })
            })
        })
    };
    for (kind, resource, rn, verb) in [
        ("ClusterRole", "leases", None, "create"),
        (
            "ClusterRole",
            "leases",
            Some("cluster-autoscaler"),
            "update",
        ),
        ("ClusterRole", "nodes", None, "list"),
        ("ClusterRole", "nodes", None, "update"),
        ("ClusterRole", "pods", None, "watch"),
        ("ClusterRole", "pods/eviction", None, "create"),
        // Watched from 1.32 (upstream chart PR #7904); 1.34 without it does not scale up.
        ("ClusterRole", "volumeattachments", None, "watch"),
        ("ClusterRole", "csinodes", None, "watch"),
        // Dynamic resource allocation is always on from 1.35.
        ("ClusterRole", "resourceslices", None, "watch"),
        ("ClusterRole", "resourceclaims", None, "watch"),
        ("ClusterRole", "deviceclasses", None, "watch"),
        ("ClusterRole", "poddisruptionbudgets", None, "list"),
        ("ClusterRole", "configmaps", None, "get"),
        (
            "Role",
            "configmaps",
            Some("cluster-autoscaler-status"),
            "update",
        ),
    ] {
        if !grants(kind, resource, rn, verb) {
            problems.push(format!(
                "no {kind} lets the autoscaler {verb} {resource} {}",
                rn.unwrap_or("")
            ));
        }
    }
    problems
}

/// Namespaced objects are in the set's namespace, cluster-scoped ones in none.
fn check_namespaces(s: &Set) -> Vec<String> {
    let cluster_scoped = ["ClusterRole", "ClusterRoleBinding", "ClusterIssuer"];
    let mut problems = Vec::new();
    for d in &s.docs {
        let ns = str_at(&d.v, "/metadata/namespace");
        if cluster_scoped.contains(&d.kind()) {
            if ns.is_some() {
                problems.push(format!("{} is cluster-scoped but has a namespace", d.id()));
            }
        } else if ns != Some(s.namespace.as_str()) {
            problems.push(format!(
                "{} is in namespace {ns:?}, the rest in {}",
                d.id(),
                s.namespace
            ));
        }
    }
    problems
}

/// A kustomize provider mounts the cloud-config CKS creates (the example describes it): Secret
/// `cloudstack-secret`, key `cloud-config`.
fn check_cloudstack_secret(s: &Set) -> Vec<String> {
    let p = match s.provider() {
        Ok(p) => p,
        Err(e) => return vec![e],
    };
    let Some(path) = flag(&p.args(), "cloud-config") else {
        return vec!["provider has no --cloud-config".into()];
    };
    match resolve_path(p.pod, p.container, &path) {
        Ok(FileSource::Secret { name, key })
            if name == "cloudstack-secret" && key == "cloud-config" =>
        {
            let example = s
                .external
                .iter()
                .find(|d| d.kind() == "Secret" && d.name() == name);
            match example.and_then(|d| str_at(&d.v, "/stringData/cloud-config")) {
                Some(ini) if ini.contains("[Global]") && ini.contains("api-url") => vec![],
                _ => {
                    vec!["examples: no cloudstack-secret with an ini [Global] cloud-config".into()]
                }
            }
        }
        Ok(other) => vec![format!(
            "provider --cloud-config {path} comes from {other:?}; CKS provides Secret cloudstack-secret key cloud-config"
        )],
        Err(e) => vec![e],
    }
}

/// The autoscaler waits for CKS nodes as long as `RECOMMENDED_MAX_NODE_PROVISION` says.
fn check_autoscaler_flags(s: &Set) -> Vec<String> {
    let a = match s.autoscaler() {
        Ok(a) => a,
        Err(e) => return vec![e],
    };
    let want = cks_autoscaler_provider::options::RECOMMENDED_MAX_NODE_PROVISION;
    match flag(&a.args(), "max-node-provision-time") {
        None => vec![
            "autoscaler: no --max-node-provision-time (the 15m default deletes CKS nodes still joining)"
                .into(),
        ],
        Some(v) => match go_duration_ms(&v) {
            Some(ms) if u128::from(ms) == want.as_millis() => vec![],
            other => vec![format!(
                "autoscaler --max-node-provision-time={v} ({other:?} ms), expected {want:?}"
            )],
        },
    }
}

/// A provider's `--max-node-provision-time`, in milliseconds (or why there is none).
fn provider_provision_ms(s: &Set) -> Result<(String, u64), String> {
    let p = s.provider()?;
    let value = flag(&p.args(), "max-node-provision-time").ok_or(
        "provider: no --max-node-provision-time (it must be the autoscalers' own, or it deletes VMs still joining as unregistered at its default)",
    )?;
    let ms = go_duration_ms(&value)
        .ok_or_else(|| format!("provider --max-node-provision-time={value} is not a duration"))?;
    Ok((value, ms))
}

/// The provider never deletes a VM as unregistered for `--max-node-provision-time` after an
/// autoscaler reported its node: it runs with the value of the autoscaler of its set.
fn check_provision_times(s: &Set) -> Vec<String> {
    let (value, ms) = match provider_provision_ms(s) {
        Ok(v) => v,
        Err(e) => return vec![e],
    };
    let Ok(a) = s.autoscaler() else {
        return vec![];
    };
    let theirs = flag(&a.args(), "max-node-provision-time");
    if theirs.as_deref().and_then(go_duration_ms) == Some(ms) {
        vec![]
    } else {
        vec![format!(
            "provider --max-node-provision-time={value}, the autoscaler's is {theirs:?}: one value for both"
        )]
    }
}

/// The autoscaler's metrics reach Prometheus: its `--address` port is its container port
/// `metrics`, which its Service serves (unless `autoscaler.service.create` is false); every
/// ServiceMonitor selects a Service of the set that has the port it names; where one scrapes
/// the provider, another scrapes the autoscaler.
fn check_metrics_services(s: &Set) -> Vec<String> {
    let mut problems = Vec::new();
    let monitors: Vec<&Doc> = s.of_kind("ServiceMonitor").collect();
    if let Ok(a) = s.autoscaler() {
        let address = flag(&a.args(), "address");
        let port = address.as_deref().and_then(port_of);
        let container = container_port(a.container, &Value::from("metrics"));
        if port.is_none() || port != container {
            problems.push(format!(
                "autoscaler --address={address:?} listens on {port:?}, its container port `metrics` is {container:?}"
            ));
        }
        let services = s.autoscaler_services();
        let wanted = s
            .values
            .pointer("/autoscaler/service/create")
            .and_then(Value::as_bool)
            != Some(false);
        if services.is_empty() && wanted {
            problems.push("no Service serves the autoscaler's metrics port".into());
        }
        for svc in &services {
            match service_port(svc, "metrics") {
                None => problems.push(format!("{}: no port `metrics`", svc.id())),
                Some(sp) => {
                    let target = sp.pointer("/targetPort").or_else(|| sp.pointer("/port"));
                    let got = target.and_then(|t| container_port(a.container, t));
                    if got.is_none() || got != port {
                        problems.push(format!(
                            "{} port `metrics` reaches container port {got:?}, the autoscaler serves its metrics on {port:?}",
                            svc.id()
                        ));
                    }
                }
            }
        }
        let provider_scraped = s.provider_service().is_ok_and(|svc| s.scraped(svc));
        if provider_scraped && !services.iter().any(|svc| s.scraped(svc)) {
            problems.push(
                "a ServiceMonitor scrapes the provider but none scrapes the autoscaler's Service"
                    .into(),
            );
        }
    }
    for sm in &monitors {
        let selector = labels_at(&sm.v, "/spec/selector/matchLabels");
        let targets: Vec<&Doc> = s
            .of_kind("Service")
            .filter(|svc| selects(&selector, &labels_at(&svc.v, "/metadata/labels")))
            .collect();
        if targets.is_empty() {
            problems.push(format!("{} selects no Service", sm.id()));
        }
        for e in arr_at(&sm.v, "/spec/endpoints") {
            let port = str_at(e, "/port").unwrap_or("");
            if !targets.iter().any(|svc| service_port(svc, port).is_some()) {
                problems.push(format!(
                    "{}: no Service it selects has a port {port:?}",
                    sm.id()
                ));
            }
        }
    }
    problems
}

/// The matcher the example alerts (docs/prometheus-rules.yaml) select the provider's series by:
/// the job a ServiceMonitor of its Service gives them.
const RULES_EXAMPLE_MATCHER: &str = r#"job=~".*cks-autoscaler-provider.*""#;

/// The group of the example alerts about the cluster-autoscaler itself, and the matcher its
/// rules select the autoscaler's series by (the job a ServiceMonitor of its metrics Service
/// gives them).
const AUTOSCALER_RULE_GROUP: &str = "cluster-autoscaler";
const AUTOSCALER_RULES_EXAMPLE_MATCHER: &str = r#"job=~".*cluster-autoscaler.*""#;

/// The matcher a rule of `group` selects its series by in the example file.
fn example_matcher(group: &str) -> &'static str {
    if group == AUTOSCALER_RULE_GROUP {
        AUTOSCALER_RULES_EXAMPLE_MATCHER
    } else {
        RULES_EXAMPLE_MATCHER
    }
}

/// The example alerts' `spec.groups`.
fn docs_rule_groups() -> Value {
    load_yaml(&repo().join("docs/prometheus-rules.yaml"))
        .ok()
        .and_then(|d| d.into_iter().next())
        .and_then(|d| d.pointer("/spec/groups").cloned())
        .unwrap_or(Value::Null)
}

/// Every rule of some groups, with its group's name.
fn rules_of(groups: &Value) -> Vec<(String, &Value)> {
    arr_at(groups, "")
        .iter()
        .flat_map(|g| {
            let group = str_at(g, "/name").unwrap_or("").to_string();
            arr_at(g, "/rules").iter().map(move |r| (group.clone(), r))
        })
        .collect()
}

fn rule_name(rule: &Value) -> String {
    str_at(rule, "/alert")
        .or_else(|| str_at(rule, "/record"))
        .unwrap_or("")
        .to_string()
}

/// The aggregations of a PromQL expression that are not taken `by` the provider instance
/// (`namespace` and `pod`): `sum(...)`, `max without (...)`, `sum by (node_group)`.
fn unscoped_aggregations(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    for op in ["sum", "max", "min", "avg", "count"] {
        let mut from = 0;
        while let Some(at) = expr[from..].find(op).map(|i| i + from) {
            from = at + op.len();
            let before_ok =
                at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
            let rest = expr[from..].trim_start();
            let after_ok =
                rest.starts_with('(') || rest.starts_with("by") || rest.starts_with("without");
            if !(before_ok && after_ok) {
                continue;
            }
            let scoped = rest.strip_prefix("by").is_some_and(|r| {
                let labels: Vec<&str> = r
                    .trim_start()
                    .strip_prefix('(')
                    .and_then(|r| r.split_once(')'))
                    .map(|(list, _)| list.split(',').map(str::trim).collect())
                    .unwrap_or_default();
                labels.contains(&"namespace") && labels.contains(&"pod")
            });
            if !scoped {
                out.push(format!(
                    "{op} {}",
                    rest.chars().take(24).collect::<String>()
                ));
            }
        }
    }
    out
}

/// The example alerts are complete: each has a unique name, an expression that selects the
/// provider's series (the autoscaler's, in its group) by the example matcher, a `for`, a
/// severity and a summary; every aggregation is taken per provider instance; the worst cases
/// are alerted on (the provider absent, not ready, its key refused; the autoscaler absent).
fn check_rule_file(groups: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let rules = rules_of(groups);
    if rules.is_empty() {
        return vec!["docs/prometheus-rules.yaml has no rules".into()];
    }
    let mut seen = BTreeSet::new();
    for (group, rule) in &rules {
        let name = rule_name(rule);
        if !seen.insert(name.clone()) {
            problems.push(format!("rule {name} is defined twice"));
        }
        let expr = str_at(rule, "/expr").unwrap_or("");
        let matcher = example_matcher(group);
        if !expr.contains(matcher) {
            problems.push(format!(
                "rule {name}: its expression does not select its series by {matcher}"
            ));
        }
        if str_at(rule, "/for").and_then(go_duration_ms).is_none() {
            problems.push(format!("rule {name} has no `for`"));
        }
        if str_at(rule, "/labels/severity").is_none() {
            problems.push(format!("rule {name} has no severity"));
        }
        if str_at(rule, "/annotations/summary").is_none() {
            problems.push(format!("rule {name} has no summary"));
        }
        for agg in unscoped_aggregations(expr) {
            problems.push(format!(
                "rule {name}: `{agg}…` is not taken by (namespace, pod): it mixes providers"
            ));
        }
    }
    let exprs: Vec<&str> = rules
        .iter()
        .filter_map(|(_, r)| str_at(r, "/expr"))
        .collect();
    for (worst, needle) in [
        ("the provider absent", "absent(up{"),
        ("the provider not ready", "cks_provider_ready"),
        ("CloudStack refusing the key", r#"outcome="unauthorized""#),
        (
            "the autoscaler absent",
            r#"absent(up{job=~".*cluster-autoscaler.*"}"#,
        ),
    ] {
        if !exprs.iter().any(|e| e.contains(needle)) {
            problems.push(format!("no rule alerts on {worst} ({needle})"));
        }
    }
    problems
}

/// A Helm set's PrometheusRule is the example alerts and only those: the same rule names, each
/// rule the same once its selector is put back to the example's. Its selector is the job the
/// set's ServiceMonitor gives the provider's series (the Service name) in the release namespace,
/// unless the values name their own.
fn check_prometheus_rule(s: &Set, docs: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let svc = match s.provider_service() {
        Ok(svc) => svc,
        Err(e) => return vec![e],
    };
    let custom = s
        .values
        .pointer("/prometheusRule/selector")
        .filter(|v| !v.is_null())
        .map(scalar)
        .filter(|v| !v.is_empty());
    let selector = custom
        .clone()
        .unwrap_or_else(|| format!(r#"job="{}", namespace="{}""#, svc.name(), s.namespace));
    if custom.is_none() {
        // The Prometheus Operator names a ServiceMonitor's job after the Service it scrapes.
        if !s.scraped(svc) {
            problems.push(format!(
                "the alerts select job {}, which no ServiceMonitor of the set scrapes",
                svc.name()
            ));
        }
    }
    // The autoscaler's group: its own selector, else the job of the set's autoscaler Service
    // when a ServiceMonitor scrapes it; without either the chart leaves the group out.
    let autoscaler_selector = s
        .values
        .pointer("/prometheusRule/autoscalerSelector")
        .filter(|v| !v.is_null())
        .map(scalar)
        .filter(|v| !v.is_empty())
        .or_else(|| {
            let svc = s
                .autoscaler_services()
                .into_iter()
                .find(|svc| s.scraped(svc))?;
            Some(format!(
                r#"job="{}", namespace="{}""#,
                svc.name(),
                s.namespace
            ))
        });
    let want: Vec<(String, &Value)> = rules_of(docs)
        .into_iter()
        .filter(|(group, _)| group != AUTOSCALER_RULE_GROUP || autoscaler_selector.is_some())
        .collect();
    for pr in s.of_kind("PrometheusRule") {
        let mut groups = pr.v.pointer("/spec/groups").cloned().unwrap_or(Value::Null);
        for g in groups.as_array_mut().into_iter().flatten() {
            let group = str_at(g, "/name").unwrap_or("").to_string();
            let (selector, what) = if group == AUTOSCALER_RULE_GROUP {
                (
                    autoscaler_selector.clone().unwrap_or_default(),
                    "the autoscaler",
                )
            } else {
                (selector.clone(), "the provider")
            };
            for r in g
                .get_mut("rules")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                let name = rule_name(r);
                let Some(expr) = r.get_mut("expr") else {
                    continue;
                };
                let text = expr.as_str().unwrap_or("").to_string();
                if selector.is_empty() || !text.contains(&selector) {
                    problems.push(format!(
                        "{}: rule {name} does not select {what} by {selector:?}",
                        pr.id()
                    ));
                }
                *expr = Value::from(text.replace(&selector, example_matcher(&group)));
            }
        }
        let got = rules_of(&groups);
        let got_names: Vec<String> = got.iter().map(|(_, r)| rule_name(r)).collect();
        let want_names: Vec<String> = want.iter().map(|(_, r)| rule_name(r)).collect();
        if got_names != want_names {
            problems.push(format!(
                "{}: rules {got_names:?}, docs/prometheus-rules.yaml has {want_names:?}",
                pr.id()
            ));
            continue;
        }
        for ((group, rule), (want_group, want_rule)) in got.iter().zip(&want) {
            if group != want_group || rule != want_rule {
                problems.push(format!(
                    "{}: rule {} differs from docs/prometheus-rules.yaml's: {rule} vs {want_rule}",
                    pr.id(),
                    rule_name(rule)
                ));
            }
        }
    }
    problems
}

/// The arguments an `extraArgs` value gives, as the chart renders them: a list as written; a map
/// sorted by name, `name: value` as --name=value (null: --name; a list: --name=item each), the
/// name cut at its first `_` (a repeated flag).
fn expected_extra_args(extra: &Value) -> Vec<String> {
    match extra {
        Value::Array(items) => items.iter().map(scalar).collect(),
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let mut out = Vec::new();
            for key in keys {
                let name = key.split('_').next().unwrap_or(key.as_str());
                match &map[key.as_str()] {
                    Value::Null => out.push(format!("--{name}")),
                    Value::Array(items) => {
                        out.extend(items.iter().map(|i| format!("--{name}={}", scalar(i))))
                    }
                    other => out.push(format!("--{name}={}", scalar(other))),
                }
            }
            out
        }
        _ => Vec::new(),
    }
}

/// Both pods leave Service variables out of their environment, every mount names a volume of
/// its pod, and a Helm set's `extraArgs` (map or list) end each container's arguments as the
/// values give them.
fn check_pod_extras(s: &Set) -> Vec<String> {
    let mut problems = Vec::new();
    for d in s.of_kind("Deployment") {
        let pod = d.v.pointer("/spec/template/spec").unwrap_or(&Value::Null);
        if pod.pointer("/enableServiceLinks") != Some(&Value::Bool(false)) {
            problems.push(format!("{}: enableServiceLinks is not false", d.id()));
        }
        let volumes: BTreeSet<&str> = arr_at(pod, "/volumes")
            .iter()
            .filter_map(|v| str_at(v, "/name"))
            .collect();
        for c in arr_at(pod, "/containers") {
            for m in arr_at(c, "/volumeMounts") {
                let name = str_at(m, "/name").unwrap_or("");
                if !volumes.contains(name) {
                    problems.push(format!(
                        "{}: mount {} names volume {name}, which the pod does not define",
                        d.id(),
                        scalar(&m["mountPath"])
                    ));
                }
            }
        }
    }
    if s.source != "helm" {
        return problems;
    }
    for (what, workload, pointer) in [
        ("provider", s.provider(), "/extraArgs"),
        ("autoscaler", s.autoscaler(), "/autoscaler/extraArgs"),
    ] {
        let Ok(w) = workload else { continue };
        let want = expected_extra_args(s.values.pointer(pointer).unwrap_or(&Value::Null));
        let args = w.args();
        if !args.ends_with(&want) {
            problems.push(format!(
                "{what}: extraArgs {want:?} are not the end of its arguments {args:?}"
            ));
        }
    }
    problems
}

// ---------------------------------------------------------------------------------------------
// Checks across sets and files

fn chart_values() -> Value {
    load_yaml(&chart_dir().join("values.yaml"))
        .ok()
        .and_then(|d| d.into_iter().next())
        .unwrap_or(Value::Null)
}

/// The supported-releases table of the README: Kubernetes minor → cluster-autoscaler release.
fn readme_releases(readme: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Some(start) = readme.find("## Supported cluster-autoscaler releases") else {
        return out;
    };
    for line in readme[start..].lines().skip(1) {
        if line.starts_with("## ") {
            break;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() > 3 && minor_number(cells[1]).is_some() {
            out.insert(cells[1].to_string(), cells[2].to_string());
        }
    }
    out
}

/// One release per Kubernetes minor, the same in the chart, in what each kustomize component
/// renders and in the README; each a release of its own minor; every minor from the oldest up
/// without a gap; the objects validated against the oldest and the newest of them.
fn check_autoscaler_releases(r: &Rendered, values: &Value, readme: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let chart: BTreeMap<String, String> = values
        .pointer("/autoscaler/image/tagByKubernetesMinor")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| (k.clone(), scalar(v))).collect())
        .unwrap_or_default();
    let mut components = BTreeMap::new();
    for s in &r.sets {
        let Some(minor) = s
            .name
            .strip_prefix("kustomize-components-cluster-autoscaler-")
        else {
            continue;
        };
        match s.autoscaler() {
            Ok(a) => {
                let image = str_at(a.container, "/image").unwrap_or("");
                if image_name(image) != AUTOSCALER_IMAGE {
                    problems.push(format!("{}: autoscaler image {image}", s.name));
                }
                components.insert(
                    minor.to_string(),
                    image_tag(image).unwrap_or("").to_string(),
                );
            }
            Err(e) => problems.push(e),
        }
    }
    if chart != components {
        problems.push(format!(
            "chart autoscaler.image.tagByKubernetesMinor {chart:?} differs from what the kustomize components render {components:?}"
        ));
    }
    let table = readme_releases(readme);
    if chart != table {
        problems.push(format!(
            "README's supported-releases table {table:?} differs from the chart's {chart:?}"
        ));
    }
    if values
        .pointer("/autoscaler/image/repository")
        .map(scalar)
        .as_deref()
        != Some(AUTOSCALER_IMAGE)
    {
        problems.push("chart autoscaler.image.repository is not the upstream image".into());
    }
    if values
        .pointer("/autoscaler/image/tag")
        .map(scalar)
        .as_deref()
        != Some("")
    {
        problems.push(
            "chart autoscaler.image.tag is set by default: the minor would not choose".into(),
        );
    }
    let mut minors: Vec<u32> = chart.keys().filter_map(|m| minor_number(m)).collect();
    minors.sort_unstable();
    if minors.len() != chart.len() {
        problems.push(format!("minors {:?} are not all 1.<n>", chart.keys()));
    }
    if let (Some(lo), Some(hi)) = (minors.first(), minors.last()) {
        if minors.len() as u32 != hi - lo + 1 {
            problems.push(format!("minors {minors:?} have a gap"));
        }
        let validated = vec![format!("1.{lo}"), format!("1.{hi}")];
        if r.minors != validated {
            problems.push(format!(
                "objects were validated for Kubernetes {:?}, the supported minors span {validated:?}",
                r.minors
            ));
        }
    } else {
        problems.push("the chart lists no autoscaler release".into());
    }
    for (minor, tag) in &chart {
        if release_minor(tag).as_deref() != Some(minor.as_str()) {
            problems.push(format!(
                "Kubernetes {minor} is given cluster-autoscaler {tag}, a release of another minor"
            ));
        }
    }
    problems
}

fn pod_container<'a>(w: &'a Workload<'_>, pointer: &str) -> Option<&'a Value> {
    w.container.pointer(pointer)
}

/// The chart rendered with its defaults (and one cluster) describes the kustomize base: the
/// same objects under the same names, flags, files behind them, images, ports, probes,
/// security settings, resources, certificates and RBAC rules.
fn check_chart_matches_base(chart: &Set, base: &Set) -> Vec<String> {
    let mut problems = Vec::new();
    let ids = |s: &Set| -> BTreeSet<(String, String)> {
        s.docs
            .iter()
            .map(|d| (d.kind().to_string(), d.name().to_string()))
            .collect()
    };
    let (c_ids, b_ids) = (ids(chart), ids(base));
    for missing in b_ids.difference(&c_ids) {
        problems.push(format!("the chart has no {missing:?}, the base has"));
    }
    for extra in c_ids.difference(&b_ids) {
        problems.push(format!("the base has no {extra:?}, the chart has"));
    }
    for (what, c, b) in [
        ("provider", chart.provider(), base.provider()),
        ("autoscaler", chart.autoscaler(), base.autoscaler()),
    ] {
        let (c, b) = match (c, b) {
            (Ok(c), Ok(b)) => (c, b),
            (Err(e), _) | (_, Err(e)) => {
                problems.push(e);
                continue;
            }
        };
        for ptr in ["/spec/replicas", "/spec/strategy"] {
            if what == "provider" && c.doc.v.pointer(ptr) != b.doc.v.pointer(ptr) {
                problems.push(format!(
                    "{what} Deployment {ptr} differs: chart {:?}, base {:?}",
                    c.doc.v.pointer(ptr),
                    b.doc.v.pointer(ptr)
                ));
            }
        }
        let mut cf = flag_map(&c.args());
        let mut bf = flag_map(&b.args());
        // The clusters are the operator's.
        cf.remove("--nodes");
        bf.remove("--nodes");
        if cf != bf {
            problems.push(format!("{what} flags differ: chart {cf:?}, base {bf:?}"));
        }
        // The provider's repository is the operator's (the base holds a placeholder an overlay
        // replaces); its tag is the release both deploy.
        let (ci, bi) = (
            str_at(c.container, "/image").unwrap_or(""),
            str_at(b.container, "/image").unwrap_or(""),
        );
        let same_image = if what == "provider" {
            image_tag(ci) == image_tag(bi)
        } else {
            ci == bi
        };
        if !same_image {
            problems.push(format!(
                "{what} container /image differs: chart {ci}, base {bi}"
            ));
        }
        for ptr in [
            "/ports",
            "/livenessProbe",
            "/readinessProbe",
            "/securityContext",
            "/resources",
            "/env",
        ] {
            if pod_container(&c, ptr) != pod_container(&b, ptr) {
                problems.push(format!(
                    "{what} container {ptr} differs: chart {:?}, base {:?}",
                    pod_container(&c, ptr),
                    pod_container(&b, ptr)
                ));
            }
        }
        for ptr in [
            "/securityContext",
            "/priorityClassName",
            "/tolerations",
            "/affinity",
            "/automountServiceAccountToken",
            "/enableServiceLinks",
            "/terminationGracePeriodSeconds",
            "/serviceAccountName",
        ] {
            if c.pod.pointer(ptr) != b.pod.pointer(ptr) {
                problems.push(format!(
                    "{what} pod {ptr} differs: chart {:?}, base {:?}",
                    c.pod.pointer(ptr),
                    b.pod.pointer(ptr)
                ));
            }
        }
        // The files behind the paths the flags name come from the same Secret keys.
        let mut paths: Vec<String> = c
            .args()
            .iter()
            .filter_map(|a| a.split_once('=').map(|(_, v)| v.to_string()))
            .filter(|v| v.starts_with('/'))
            .collect();
        if let Ok(cc) = chart.autoscaler_cloud_config()
            && what == "autoscaler"
        {
            for field in ["/key", "/cert", "/cacert"] {
                paths.extend(str_at(&cc, field).map(str::to_string));
            }
        }
        for path in paths {
            let (cs, bs) = (
                resolve_path(c.pod, c.container, &path),
                resolve_path(b.pod, b.container, &path),
            );
            if cs != bs {
                problems.push(format!("{what} {path}: chart mounts {cs:?}, base {bs:?}"));
            }
        }
    }
    if chart.autoscaler_cloud_config().ok() != base.autoscaler_cloud_config().ok() {
        problems.push(format!(
            "autoscaler cloud-configs differ: chart {:?}, base {:?}",
            chart.autoscaler_cloud_config(),
            base.autoscaler_cloud_config()
        ));
    }
    for kind in ["Certificate", "Issuer", "ClusterRole", "Role"] {
        for c in chart.of_kind(kind) {
            let Some(b) = base.find(kind, c.name()) else {
                continue;
            };
            for ptr in ["/spec", "/rules"] {
                if c.v.pointer(ptr) != b.v.pointer(ptr) {
                    problems.push(format!(
                        "{kind} {} {ptr} differs: chart {:?}, base {:?}",
                        c.name(),
                        c.v.pointer(ptr),
                        b.v.pointer(ptr)
                    ));
                }
            }
        }
    }
    for kind in ["Service", "PodDisruptionBudget"] {
        for c in chart.of_kind(kind) {
            let Some(b) = base.find(kind, c.name()) else {
                continue;
            };
            for ptr in [
                "/spec/ports",
                "/spec/type",
                "/spec/maxUnavailable",
                "/spec/minAvailable",
                "/spec/unhealthyPodEvictionPolicy",
            ] {
                if c.v.pointer(ptr) != b.v.pointer(ptr) {
                    problems.push(format!(
                        "{kind} {} {ptr} differs: chart {:?}, base {:?}",
                        c.name(),
                        c.v.pointer(ptr),
                        b.v.pointer(ptr)
                    ));
                }
            }
        }
    }
    problems
}

/// A workload cluster's autoscaler and the central provider it dials: the host is in the
/// server certificate, the port is the external Service's, the identity it claims is bound to
/// a cluster and issued by the central CA.
fn check_central_pair(central: &Set, workload: &Set) -> Vec<String> {
    let mut problems = Vec::new();
    if central.has_autoscaler() {
        problems.push(format!(
            "{}: a central provider example should run no autoscaler",
            central.name
        ));
    }
    if workload.has_provider() {
        problems.push(format!(
            "{}: a workload cluster runs no provider",
            workload.name
        ));
    }
    let cc = match workload.autoscaler_cloud_config() {
        Ok(cc) => cc,
        Err(e) => return vec![e],
    };
    let theirs = workload
        .autoscaler()
        .ok()
        .and_then(|a| flag(&a.args(), "max-node-provision-time"));
    match provider_provision_ms(central) {
        Err(e) => problems.push(e),
        Ok((value, ms)) if theirs.as_deref().and_then(go_duration_ms) != Some(ms) => {
            problems.push(format!(
                "the central provider's --max-node-provision-time={value}, the workload autoscaler's {theirs:?}"
            ))
        }
        Ok(_) => {}
    }
    let address = str_at(&cc, "/address").unwrap_or("");
    let (Some(host), Some(port)) = (host_of(address), port_of(address)) else {
        return vec![format!(
            "workload autoscaler address {address:?} is not host:port"
        )];
    };
    let server = central.provider().ok().and_then(|p| {
        flag(&p.args(), "tls-cert")
            .and_then(|path| resolve_path(p.pod, p.container, &path).ok())
            .and_then(|src| match src {
                FileSource::Secret { name, .. } => central.certificate_for_secret(&name),
                FileSource::ConfigMap { .. } => None,
            })
    });
    match server {
        None => problems.push("central provider: no server Certificate".into()),
        Some(server) => {
            let mut names = strings_at(&server.v, "/spec/dnsNames");
            names.extend(strings_at(&server.v, "/spec/ipAddresses"));
            if !names.iter().any(|n| n == host) {
                problems.push(format!(
                    "the workload autoscaler dials {host}, which the central server certificate ({names:?}) does not name"
                ));
            }
        }
    }
    let ports: Vec<u64> = central
        .external_services()
        .iter()
        .flat_map(|svc| arr_at(&svc.v, "/spec/ports").to_vec())
        .filter_map(|p| p.pointer("/port").and_then(Value::as_u64))
        .collect();
    if !ports.contains(&port) {
        problems.push(format!(
            "the workload autoscaler dials port {port}; the central external Services serve {ports:?}"
        ));
    }
    match autoscaler_identity(workload) {
        Err(e) => problems.push(e),
        Ok((client, _)) => {
            let bound = central.groups().iter().any(|g| {
                g.as_ref()
                    .is_ok_and(|g| g.client.as_deref() == Some(client.as_str()))
            });
            if !bound {
                problems.push(format!(
                    "the workload autoscaler is client {client}, which no central --nodes binds"
                ));
            }
            if !central
                .of_kind("Certificate")
                .any(|c| certificate_names(c).contains(&client))
            {
                problems.push(format!(
                    "the central cluster issues no client certificate for {client}"
                ));
            }
        }
    }
    problems
}

/// Dockerfile instructions with line continuations joined.
fn dockerfile_instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if let Some(stripped) = trimmed.strip_suffix('\\') {
            current.push_str(stripped);
            current.push(' ');
            continue;
        }
        if trimmed.starts_with('#') {
            continue;
        }
        current.push_str(trimmed);
        let (op, rest) = current
            .split_once(char::is_whitespace)
            .unwrap_or((&current, ""));
        out.push((op.to_ascii_uppercase(), rest.trim().to_string()));
        current.clear();
    }
    out
}

/// The build stage cross-compiles (it runs on the build host's platform, the image's
/// architecture chosen by `TARGETARCH`), for each of amd64 and arm64, through the script CI
/// also runs (`tools/static-build/build.sh`), which builds `--release --locked` for a musl
/// target; the frontend is pinned to a minor version.
fn check_static_build(dockerfile: &str, ins: &[(String, String)]) -> Vec<String> {
    let mut problems = Vec::new();
    let syntax = dockerfile
        .lines()
        .find_map(|l| l.trim().strip_prefix("# syntax=docker/dockerfile:"));
    if !syntax.is_some_and(|v| {
        v.split('.').count() >= 2 && v.split('.').all(|p| p.parse::<u32>().is_ok())
    }) {
        problems.push(format!(
            "Dockerfile's frontend is not pinned to a version (# syntax=docker/dockerfile:MAJOR.MINOR): {syntax:?}"
        ));
    }
    let build_from = ins
        .iter()
        .find(|(op, _)| op == "FROM")
        .map(|(_, r)| r.as_str());
    if !build_from.is_some_and(|r| r.starts_with("--platform=$BUILDPLATFORM ")) {
        problems.push(format!(
            "the build stage does not run on the build host's platform (FROM --platform=$BUILDPLATFORM): {build_from:?}; an arm64 build would run under emulation"
        ));
    }
    let script = "tools/static-build/build.sh";
    match ins.iter().find(|(op, r)| op == "RUN" && r.contains(script)) {
        None => problems.push(format!("Dockerfile does not build through {script}")),
        Some((_, run)) => {
            for (arch, target) in [
                ("amd64", "x86_64-unknown-linux-musl"),
                ("arm64", "aarch64-unknown-linux-musl"),
            ] {
                if !run.contains(&format!("{arch}) target={target}")) {
                    problems.push(format!(
                        "the build step does not map TARGETARCH {arch} to {target}"
                    ));
                }
            }
            if !run.contains("id=cks-target-$TARGETARCH") {
                problems.push("the build step's target cache is not one per architecture".into());
            }
        }
    }
    match fs::read_to_string(repo().join(script)) {
        Ok(text) => {
            if !text.lines().any(|l| {
                let l = l.trim();
                l.starts_with("cargo zigbuild")
                    && l.contains("--release")
                    && l.contains("--locked")
                    && l.contains("--target")
            }) {
                problems.push(format!(
                    "{script} does not run cargo zigbuild --release --locked --target"
                ));
            }
        }
        Err(e) => problems.push(format!("{script}: {e}")),
    }
    problems
}

/// A multi-stage build through [`check_static_build`], base images pinned by digest, a
/// static final base, the binary where the Deployment expects it, the user the pod runs as,
/// and the ports the flags use.
fn check_dockerfile(s: &Set, dockerfile: &str, dockerignore: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let ins = dockerfile_instructions(dockerfile);
    let froms: Vec<String> = ins
        .iter()
        .filter(|(op, _)| op == "FROM")
        .map(|(_, rest)| {
            rest.split_whitespace()
                .find(|w| !w.starts_with("--"))
                .unwrap_or("")
                .to_string()
        })
        .collect();
    if froms.len() < 2 {
        problems.push("Dockerfile is not multi-stage".into());
    }
    for image in &froms {
        let digest = image.split_once("@sha256:").map(|(_, d)| d);
        let pinned = !image.contains('$')
            && digest.is_some_and(|d| d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit()));
        if !pinned {
            problems.push(format!(
                "Dockerfile FROM {image} is not pinned by digest (@sha256:…)"
            ));
        }
    }
    let final_base = froms.last().cloned().unwrap_or_default();
    if !final_base.starts_with("gcr.io/distroless/static") {
        problems.push(format!(
            "final stage {final_base} is not a static (distroless) base"
        ));
    }
    problems.extend(check_static_build(dockerfile, &ins));
    let last_from = ins.iter().rposition(|(op, _)| op == "FROM").unwrap_or(0);
    let final_stage = &ins[last_from..];
    if !final_stage.iter().any(|(op, rest)| {
        op == "COPY" && rest.contains("--from=") && rest.ends_with(PROVIDER_BINARY)
    }) {
        problems.push(format!(
            "final stage does not COPY the binary to {PROVIDER_BINARY}"
        ));
    }
    match final_stage.iter().rev().find(|(op, _)| op == "ENTRYPOINT") {
        Some((_, e)) if e.contains(&format!("\"{PROVIDER_BINARY}\"")) => {}
        _ => problems.push(format!("ENTRYPOINT is not [\"{PROVIDER_BINARY}\"]")),
    }
    let user = final_stage
        .iter()
        .rev()
        .find(|(op, _)| op == "USER")
        .map(|(_, u)| u.clone());
    let uid = user
        .as_deref()
        .and_then(|u| u.split(':').next())
        .and_then(|u| u.parse::<u64>().ok());
    let p = s.provider();
    match (uid, &p) {
        (None | Some(0), _) => problems.push(format!(
            "final stage USER {user:?} is not a numeric non-root uid"
        )),
        (Some(uid), Ok(p)) => {
            let pod_uid = p
                .pod
                .pointer("/securityContext/runAsUser")
                .and_then(Value::as_u64);
            if pod_uid != Some(uid) {
                problems.push(format!(
                    "image USER {uid} but the provider pod runs as {pod_uid:?}"
                ));
            }
        }
        (Some(_), Err(e)) => problems.push(e.clone()),
    }
    let exposed: BTreeSet<u64> = final_stage
        .iter()
        .filter(|(op, _)| op == "EXPOSE")
        .flat_map(|(_, r)| {
            r.split_whitespace()
                .filter_map(|p| p.split('/').next()?.parse().ok())
                .collect::<Vec<u64>>()
        })
        .collect();
    if let Ok(p) = p {
        let args = p.args();
        for name in ["listen", "metrics-listen"] {
            let port = flag(&args, name).and_then(|l| port_of(&l));
            if !port.is_some_and(|port| exposed.contains(&port)) {
                problems.push(format!(
                    "Dockerfile EXPOSE {exposed:?} lacks the --{name} port {port:?}"
                ));
            }
        }
        if let Some(cmd) = strings_at(p.container, "/command").first()
            && cmd != PROVIDER_BINARY
        {
            problems.push(format!("provider command {cmd} is not {PROVIDER_BINARY}"));
        }
    }
    let ignored: BTreeSet<&str> = dockerignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.trim_end_matches('/'))
        .collect();
    for needed in [
        "src",
        "Cargo.toml",
        "Cargo.lock",
        "build.rs",
        "proto",
        "tools",
    ] {
        if ignored.contains(needed) || ignored.contains("*") {
            problems.push(format!(
                ".dockerignore excludes {needed}, which the build needs"
            ));
        }
    }
    for heavy in ["target", ".git"] {
        if !ignored.contains(heavy) {
            problems.push(format!(".dockerignore does not exclude {heavy}"));
        }
    }
    problems
}

// ---------------------------------------------------------------------------------------------
// Tests on what the tools rendered

fn assert_none(what: &str, problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "{what}:\n  - {}",
        problems.join("\n  - ")
    );
}

/// Runs `check` on every set `applies` selects (at least one), each problem named by its set.
fn every(
    r: &Rendered,
    applies: impl Fn(&Set) -> bool,
    check: fn(&Set) -> Vec<String>,
) -> Vec<String> {
    let sets: Vec<&Set> = r.sets.iter().filter(|s| applies(s)).collect();
    assert!(!sets.is_empty(), "no rendered set to check");
    sets.into_iter()
        .flat_map(|s| {
            check(s)
                .into_iter()
                .map(move |p| format!("{}: {p}", s.name))
        })
        .collect()
}

#[test]
fn the_tools_render_lint_and_validate_every_manifest() {
    let r = rendered();
    if let ToolsRun::Ran { ok, output, .. } = tools_run() {
        assert!(ok, "tools/check_manifests.py found problems:\n{output}");
    }
    let names: BTreeSet<&str> = r.sets.iter().map(|s| s.name.as_str()).collect();
    for expected in [
        "kustomize-base",
        "kustomize-overlays-example",
        "kustomize-components-cloudstack-ca",
        "kustomize-components-own-certificates",
        "example-cloudstack-secret",
        "helm-ci-default",
        "helm-ci-rbac-off",
        "helm-ci-own-certificates-and-accounts",
        "helm-ci-oldest-minor-plaintext",
        "helm-ci-parity-options",
        "helm-examples-central-provider",
        "helm-examples-workload-cluster",
    ] {
        assert!(
            names.contains(expected),
            "{expected} not rendered: {names:?}"
        );
    }
    for s in &r.sets {
        assert!(!s.docs.is_empty(), "{} rendered nothing", s.name);
    }
}

#[test]
fn ports_agree_between_flags_containers_services_probes_and_address() {
    let r = rendered();
    assert_none("ports", every(r, Set::has_provider, check_ports));
}

#[test]
fn provider_flag_paths_are_mounted_from_existing_secret_keys() {
    let r = rendered();
    assert_none(
        "provider mounts",
        every(r, Set::has_provider, check_provider_mounts),
    );
}

#[test]
fn kustomize_providers_read_the_cloudstack_secret_cks_creates() {
    let r = rendered();
    assert_none(
        "cloudstack-secret",
        every(
            r,
            |s| s.source == "kustomize" && s.has_provider(),
            check_cloudstack_secret,
        ),
    );
}

#[test]
fn autoscaler_cloud_config_matches_its_client_certificate_and_the_provider() {
    let r = rendered();
    assert_none(
        "autoscaler wiring",
        every(r, Set::has_autoscaler, check_autoscaler_wiring),
    );
}

#[test]
fn server_certificate_covers_the_address_and_shares_the_client_ca() {
    let r = rendered();
    assert_none("tls", every(r, Set::uses_cert_manager, check_tls));
}

#[test]
fn every_client_the_nodes_bind_has_its_certificate_and_several_clusters_are_bound() {
    let r = rendered();
    assert_none(
        "client binding",
        every(r, Set::has_provider, check_client_binding),
    );
    // The central example binds several clusters, each to its own client.
    let central = r.set("helm-examples-central-provider");
    let clients: BTreeSet<Option<String>> = central
        .groups()
        .into_iter()
        .map(|g| g.expect("group").client)
        .collect();
    assert!(
        clients.len() >= 2 && !clients.contains(&None),
        "{clients:?}"
    );
}

#[test]
fn pods_are_non_root_read_only_and_confined() {
    let r = rendered();
    assert_none(
        "security",
        every(r, |s| s.source != "example", check_security),
    );
}

#[test]
fn images_are_pinned_and_the_provider_runs_the_crate_version() {
    let r = rendered();
    assert_none("images", every(r, |s| s.source != "example", check_images));
}

#[test]
fn the_chart_runs_the_image_its_values_name_and_refuses_to_render_without_one() {
    let r = rendered();
    assert_none(
        "provider image",
        every(
            r,
            |s| s.source == "helm" && s.has_provider(),
            check_provider_image,
        ),
    );
    assert_none("image refusal", check_image_refusal(&r.refusals));
    // One values file names the image by digest.
    assert!(
        r.sets.iter().any(|s| s.source == "helm"
            && s.provider().is_ok_and(
                |p| str_at(p.container, "/image").is_some_and(|i| i.contains("@sha256:"))
            )),
        "no values file renders the provider image by digest"
    );
}

#[test]
fn network_policy_admits_only_the_autoscalers_and_prometheus() {
    let r = rendered();
    assert_none(
        "network policy",
        every(r, Set::has_provider, check_network_policy),
    );
}

#[test]
fn selectors_service_accounts_budgets_and_rbac_line_up() {
    let r = rendered();
    assert_none(
        "identity",
        every(r, |s| s.source != "example", check_identity),
    );
}

#[test]
fn the_provider_is_bound_to_its_state_configmap_and_nothing_else() {
    let r = rendered();
    assert_none(
        "provider RBAC",
        every(r, |s| s.source != "example", check_provider_rbac),
    );
    // The chart's stores: the ConfigMap by default, a file on a claim (ci/state-file-values).
    let args = |set: &str| r.set(set).provider().map(|p| p.args()).unwrap_or_default();
    assert!(flag(&args("helm-ci-default"), "state-configmap").is_some());
    assert!(flag(&args("kustomize-base"), "state-configmap").is_some());
    let file = args("helm-ci-state-file");
    assert!(flag(&file, "state-file").is_some() && flag(&file, "state-configmap").is_none());
}

#[test]
fn two_providers_elect_a_leader_and_the_services_reach_only_the_leader() {
    let r = rendered();
    assert_none(
        "provider replicas",
        every(r, |s| s.source != "example", check_replicas),
    );
    // Two replicas electing a leader by default; one, without, beside a state file.
    for set in [
        "helm-ci-default",
        "kustomize-base",
        "helm-examples-central-provider",
    ] {
        let p = r.set(set).provider().expect("provider");
        assert!(p.leader_elect() && p.replicas() == 2, "{set}");
    }
    let p = r.set("helm-ci-state-file").provider().expect("provider");
    assert!(!p.leader_elect() && p.replicas() == 1);
}

#[test]
fn replicas_without_leader_election_or_a_service_reaching_a_standby_are_caught() {
    let r = rendered();
    let mut b = base(r);
    set_arg(&mut b, PROVIDER, "--leader-elect", "--log-format=json");
    assert_caught(check_replicas(&b), "2 replicas without --leader-elect");
    let mut b = base(r);
    let d = b.find("Service", PROVIDER).expect("service").v.clone();
    let mut selector = d["spec"]["selector"].clone();
    selector
        .as_object_mut()
        .expect("selector")
        .remove(LEADER_LABEL.0);
    edit(&mut b, "Service", PROVIDER, "/spec/selector", selector);
    assert_caught(
        check_replicas(&b),
        "does not select cks-autoscaler-provider/role",
    );
    let mut b = base(r);
    edit(
        &mut b,
        "Deployment",
        PROVIDER,
        "/spec/strategy",
        serde_json::json!({"type": "Recreate"}),
    );
    edit(
        &mut b,
        "PodDisruptionBudget",
        PROVIDER,
        "/spec/minAvailable",
        Value::from(0),
    );
    let problems = check_replicas(&b);
    assert_caught(problems.clone(), "a rollout stops them all at once");
    assert_caught(problems, "not minAvailable 1");
    let mut b = base(r);
    edit(
        &mut b,
        "Deployment",
        PROVIDER,
        "/spec/template/spec/containers/0/env/1/valueFrom/fieldRef/fieldPath",
        Value::from("spec.nodeName"),
    );
    assert_caught(check_replicas(&b), "POD_NAME");
    let mut b = base(r);
    edit(
        &mut b,
        "Role",
        "cks-autoscaler-provider-leader-election",
        "/rules/2/verbs",
        serde_json::json!(["get", "patch", "delete"]),
    );
    assert_caught(check_provider_rbac(&b), "grants delete");
    let mut b = base(r);
    edit(
        &mut b,
        "Role",
        "cks-autoscaler-provider-leader-election",
        "/rules/0/resourceNames",
        serde_json::json!(["another-lease"]),
    );
    assert_caught(
        check_provider_rbac(&b),
        "update leases cks-autoscaler-provider",
    );
}

#[test]
fn the_provider_reads_nodes_only_where_it_runs_in_its_one_cluster() {
    let r = rendered();
    assert_none(
        "provider node RBAC",
        every(r, |s| s.source != "example", check_provider_node_rbac),
    );
    let confirms = |set: &str| {
        r.set(set)
            .provider()
            .map(|p| p.args())
            .unwrap_or_default()
            .iter()
            .any(|a| a == "--confirm-node-marks")
    };
    // Beside its cluster's autoscaler, one cluster: on.
    assert!(confirms("helm-ci-default"));
    assert!(confirms("kustomize-base"));
    // A central provider cannot read its clusters' Nodes: off.
    assert!(!confirms("helm-examples-central-provider"));
}

#[test]
fn objects_are_in_their_release_namespace() {
    let r = rendered();
    assert_none("namespaces", every(r, |_| true, check_namespaces));
    assert_eq!(
        r.set("helm-ci-oldest-minor-plaintext").namespace,
        "autoscaling"
    );
}

#[test]
fn each_kubernetes_minor_gets_its_autoscaler_release_in_the_chart_and_kustomize() {
    let r = rendered();
    let readme = fs::read_to_string(repo().join("README.md")).expect("README.md");
    assert_none(
        "autoscaler releases",
        check_autoscaler_releases(r, &chart_values(), &readme),
    );
}

#[test]
fn the_autoscaler_waits_long_enough_for_cks_nodes() {
    let r = rendered();
    assert_none(
        "autoscaler flags",
        every(r, Set::has_autoscaler, check_autoscaler_flags),
    );
}

#[test]
fn the_provider_and_its_autoscalers_wait_the_same_provision_time() {
    let r = rendered();
    assert_none(
        "provision times",
        every(r, Set::has_provider, check_provision_times),
    );
}

#[test]
fn prometheus_scrapes_the_autoscaler_metrics_service_on_its_container_port() {
    let r = rendered();
    assert_none(
        "metrics services",
        every(r, |s| s.source != "example", check_metrics_services),
    );
    // The values that enable the ServiceMonitors render one for the autoscaler.
    assert!(
        r.sets.iter().any(|s| s
            .of_kind("ServiceMonitor")
            .any(|sm| s.autoscaler().is_ok_and(|a| sm.name() == a.doc.name()))),
        "no values file renders the autoscaler's ServiceMonitor"
    );
}

#[test]
fn the_chart_renders_the_example_alerts() {
    let r = rendered();
    let docs = docs_rule_groups();
    assert_none(
        "prometheus rules",
        every(
            r,
            |s| s.of_kind("PrometheusRule").next().is_some(),
            |s| check_prometheus_rule(s, &docs_rule_groups()),
        ),
    );
    assert!(!rules_of(&docs).is_empty());
}

#[test]
fn extra_args_volumes_and_service_links_render_as_the_values_say() {
    let r = rendered();
    assert_none(
        "pod extras",
        every(r, |s| s.source != "example", check_pod_extras),
    );
    // The parity values give both forms' every shape: a flag alone, a list, a repeated flag.
    let parity = r.set("helm-ci-parity-options");
    let provider = parity.provider().expect("provider").args();
    let autoscaler = parity.autoscaler().expect("autoscaler").args();
    for arg in [
        "--template-label=example.com/tier=batch",
        "--template-taint=example.com/gpu:NoSchedule",
    ] {
        assert!(provider.iter().any(|a| a == arg), "{arg} in {provider:?}");
    }
    assert!(
        autoscaler
            .iter()
            .any(|a| a == "--balance-similar-node-groups"),
        "{autoscaler:?}"
    );
}

#[test]
fn chart_defaults_render_the_kustomize_base() {
    let r = rendered();
    assert_none(
        "chart vs base",
        check_chart_matches_base(r.set("helm-ci-default"), r.set("kustomize-base")),
    );
}

#[test]
fn the_workload_cluster_example_dials_the_central_example() {
    let r = rendered();
    assert_none(
        "central deployment",
        check_central_pair(
            r.set("helm-examples-central-provider"),
            r.set("helm-examples-workload-cluster"),
        ),
    );
}

/// An overlay leaves none of the base's placeholders: its `--nodes` patch lands on the
/// provider's `--nodes`, its `images` on the provider's image.
fn check_overlay(s: &Set, base: &Set) -> Vec<String> {
    let mut problems = Vec::new();
    let (p, b) = match (s.provider(), base.provider()) {
        (Ok(p), Ok(b)) => (p, b),
        (Err(e), _) | (_, Err(e)) => return vec![e],
    };
    let nodes = flag_values(&p.args(), "nodes");
    if nodes.is_empty() || nodes.iter().any(|n| n.contains("REPLACE-WITH")) {
        problems.push(format!(
            "provider --nodes {nodes:?} keeps the base's placeholder"
        ));
    }
    let mut rest = flag_map(&p.args());
    let mut base_rest = flag_map(&b.args());
    rest.remove("--nodes");
    base_rest.remove("--nodes");
    if rest != base_rest {
        problems.push(format!(
            "the overlay changed provider flags other than --nodes: {rest:?} vs {base_rest:?}"
        ));
    }
    let image = str_at(p.container, "/image").unwrap_or("");
    if image == str_at(b.container, "/image").unwrap_or("") {
        problems.push(format!("provider image {image} is still the base's"));
    }
    problems
}

#[test]
fn overlays_replace_the_base_placeholders() {
    let r = rendered();
    let base = r.set("kustomize-base");
    let overlays: Vec<&Set> = r
        .sets
        .iter()
        .filter(|s| s.name.starts_with("kustomize-overlays-"))
        .collect();
    assert!(!overlays.is_empty());
    for s in overlays {
        assert_none(&s.name, check_overlay(s, base));
    }
    // The check notices a patch that lands on another argument.
    let mut shifted = r.set("kustomize-overlays-example").clone();
    set_arg(
        &mut shifted,
        PROVIDER,
        "--nodes=",
        "--nodes=1:5:REPLACE-WITH-CKS-CLUSTER-ID",
    );
    assert_caught(check_overlay(&shifted, base), "placeholder");
}

#[test]
fn dockerfile_builds_the_binary_the_deployment_runs() {
    let r = rendered();
    let dockerfile = fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    let dockerignore = fs::read_to_string(repo().join(".dockerignore")).expect(".dockerignore");
    assert_none(
        "Dockerfile",
        check_dockerfile(r.set("kustomize-base"), &dockerfile, &dockerignore),
    );
}

// ---------------------------------------------------------------------------------------------
// Tests on plain files (no tool needed)

#[test]
fn the_example_alerts_cover_the_worst_cases_and_the_chart_carries_them_unchanged() {
    let docs = fs::read_to_string(repo().join("docs/prometheus-rules.yaml")).expect("rules");
    let chart = fs::read_to_string(chart_dir().join("files/prometheus-rules.yaml"))
        .expect("the chart's copy");
    assert!(
        docs == chart,
        "deploy/helm/cks-autoscaler-provider/files/prometheus-rules.yaml differs from docs/prometheus-rules.yaml: copy it"
    );
    assert_none("example alerts", check_rule_file(&docs_rule_groups()));
}

#[test]
fn an_alert_without_for_or_mixing_providers_is_caught() {
    let groups = docs_rule_groups();
    let mut no_for = groups.clone();
    if let Some(rule) = no_for
        .pointer_mut("/0/rules/0")
        .and_then(Value::as_object_mut)
    {
        rule.remove("for");
    }
    assert_caught(check_rule_file(&no_for), "has no `for`");
    let text = serde_json::to_string(&groups).expect("json");
    assert!(text.contains("sum by (namespace, pod, node_group)"));
    let mixed: Value = serde_json::from_str(
        &text.replace("sum by (namespace, pod, node_group)", "sum by (node_group)"),
    )
    .expect("json");
    assert_caught(check_rule_file(&mixed), "mixes providers");
    let no_worst: Value =
        serde_json::from_str(&text.replace("cks_provider_ready", "cks_provider_build_info"))
            .expect("json");
    assert_caught(check_rule_file(&no_worst), "the provider not ready");
    assert_eq!(
        unscoped_aggregations("max by (namespace, pod) (max_over_time(x[1h])) == 1"),
        Vec::<String>::new()
    );
    assert_eq!(unscoped_aggregations("sum(x)").len(), 1);
}

#[test]
fn chart_metadata_follows_the_crate_version_and_the_oldest_supported_minor() {
    let chart = load_yaml(&chart_dir().join("Chart.yaml"))
        .expect("Chart.yaml parses")
        .into_iter()
        .next()
        .expect("Chart.yaml has a document");
    assert_eq!(str_at(&chart, "/name"), Some("cks-autoscaler-provider"));
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        chart.pointer("/version").map(scalar).as_deref(),
        Some(version)
    );
    assert_eq!(
        chart.pointer("/appVersion").map(scalar).as_deref(),
        Some(version)
    );
    let readme = fs::read_to_string(repo().join("README.md")).expect("README.md");
    let oldest = readme_releases(&readme)
        .keys()
        .min_by_key(|m| minor_number(m))
        .cloned()
        .expect("README lists releases");
    assert_eq!(
        str_at(&chart, "/kubeVersion"),
        Some(format!(">={oldest}.0-0").as_str()),
        "the chart installs on the clusters the README supports"
    );
}

#[test]
fn readme_and_chart_list_the_same_autoscaler_release_per_minor() {
    let readme = fs::read_to_string(repo().join("README.md")).expect("README.md");
    let table = readme_releases(&readme);
    assert!(table.len() >= 9, "{table:?}");
    let chart: BTreeMap<String, String> = chart_values()
        .pointer("/autoscaler/image/tagByKubernetesMinor")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| (k.clone(), scalar(v))).collect())
        .unwrap_or_default();
    assert_eq!(table, chart);
}

#[test]
fn go_durations_flags_and_node_groups_parse_as_the_tools_do() {
    assert_eq!(go_duration_ms("10s"), Some(10_000));
    assert_eq!(go_duration_ms("1m30s"), Some(90_000));
    assert_eq!(go_duration_ms("500ms"), Some(500));
    assert_eq!(go_duration_ms("10"), None);
    let args: Vec<String> = [
        "serve",
        "--nodes=1:2:a",
        "--nodes",
        "3:4:b@x.example",
        "--insecure",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(
        flag_values(&args, "nodes"),
        vec!["1:2:a", "3:4:b@x.example"]
    );
    assert_eq!(flag(&args, "insecure").as_deref(), Some(""));
    assert_eq!(
        parse_group("3:4:b@x.example"),
        Some(Group {
            cluster: "b".into(),
            client: Some("x.example".into())
        })
    );
    assert_eq!(parse_group("1:2:a").and_then(|g| g.client), None);
    assert_eq!(parse_group("1:a"), None);
    assert_eq!(parse_group("x:2:a"), None);
    assert_eq!(release_minor("v1.33.6").as_deref(), Some("1.33"));
    assert_eq!(release_minor("1.33.6"), None);
    assert_eq!(release_minor("v1.33"), None);
    // Kubernetes reads a leading-zero mode as octal.
    let v = parse_yaml("mode: 0440\n").expect("yaml");
    assert_eq!(v[0]["mode"].as_u64(), Some(0o440));
    let readme = "## Supported cluster-autoscaler releases\n\n| Kubernetes | ca |\n|---|---|\n| 1.28 | v1.28.7 | x |\n\n## Next\n| 1.29 | v1.29.5 | x |\n";
    assert_eq!(
        readme_releases(readme),
        BTreeMap::from([("1.28".to_string(), "v1.28.7".to_string())])
    );
}

// ---------------------------------------------------------------------------------------------
// Broken wiring is caught: each test breaks one thing of a rendered set in memory.

fn edit(s: &mut Set, kind: &str, name: &str, pointer: &str, value: Value) {
    let set = s.name.clone();
    let doc = s
        .docs
        .iter_mut()
        .find(|d| d.kind() == kind && d.name() == name)
        .unwrap_or_else(|| panic!("{kind} {name} in {set}"));
    *doc.v
        .pointer_mut(pointer)
        .unwrap_or_else(|| panic!("{pointer} in {kind} {name}")) = value;
}

fn edit_cloud_config(s: &mut Set, from: &str, to: &str) {
    let doc = s
        .docs
        .iter_mut()
        .find(|d| d.kind() == "ConfigMap" && d.name() == "cks-cluster-autoscaler-cloud-config")
        .expect("autoscaler cloud-config");
    let text = doc.v["data"]["cloud-config"]
        .as_str()
        .expect("text")
        .to_string();
    assert!(text.contains(from), "{from} in the cloud-config");
    doc.v["data"]["cloud-config"] = Value::String(text.replace(from, to));
}

fn arg_index(s: &Set, deployment: &str, prefix: &str) -> usize {
    let d = s.find("Deployment", deployment).expect("deployment");
    strings_at(&d.v, "/spec/template/spec/containers/0/args")
        .iter()
        .position(|a| a.starts_with(prefix))
        .unwrap_or_else(|| panic!("{deployment} arg {prefix}"))
}

fn set_arg(s: &mut Set, deployment: &str, prefix: &str, value: &str) {
    let i = arg_index(s, deployment, prefix);
    edit(
        s,
        "Deployment",
        deployment,
        &format!("/spec/template/spec/containers/0/args/{i}"),
        Value::from(value),
    );
}

fn base(r: &Rendered) -> Set {
    r.set("kustomize-base").clone()
}

const PROVIDER: &str = "cks-autoscaler-provider";
const AUTOSCALER: &str = "cks-cluster-autoscaler";

fn assert_caught(problems: Vec<String>, needle: &str) {
    assert!(
        problems.iter().any(|p| p.contains(needle)),
        "expected a problem mentioning {needle:?}, got {problems:?}"
    );
}

#[test]
fn a_service_port_that_differs_from_the_address_is_caught() {
    let r = rendered();
    let mut b = base(r);
    edit(
        &mut b,
        "Service",
        PROVIDER,
        "/spec/ports/0/port",
        Value::from(8087),
    );
    assert_caught(check_ports(&b), "autoscaler address");
}

#[test]
fn a_container_port_that_differs_from_the_listen_flag_is_caught() {
    let r = rendered();
    let mut b = base(r);
    set_arg(&mut b, PROVIDER, "--listen=", "--listen=0.0.0.0:9999");
    assert_caught(check_ports(&b), "container port `grpc`");
    assert_caught(
        check_network_policy(&b),
        "no NetworkPolicy rule admits the autoscaler",
    );
    let dockerfile = fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    assert_caught(
        check_dockerfile(&b, &dockerfile, "target\n.git\n"),
        "--listen port",
    );
}

#[test]
fn a_probe_on_the_wrong_port_is_caught() {
    let r = rendered();
    let mut b = base(r);
    edit(
        &mut b,
        "Deployment",
        PROVIDER,
        "/spec/template/spec/containers/0/readinessProbe/httpGet/port",
        Value::from("grpc"),
    );
    assert_caught(check_ports(&b), "readinessProbe probes port");
}

#[test]
fn a_tls_path_outside_the_mount_is_caught() {
    let r = rendered();
    let mut b = base(r);
    set_arg(&mut b, PROVIDER, "--tls-cert=", "--tls-cert=/certs/tls.crt");
    assert_caught(check_provider_mounts(&b), "--tls-cert");
}

#[test]
fn a_misspelt_secret_name_is_caught() {
    let r = rendered();
    let mut b = base(r);
    let volumes = arr_at(
        &b.find("Deployment", PROVIDER).expect("provider").v,
        "/spec/template/spec/volumes",
    )
    .to_vec();
    let i = volumes
        .iter()
        .position(|v| str_at(v, "/secret/secretName") == Some("cloudstack-secret"))
        .expect("cloud-config volume");
    edit(
        &mut b,
        "Deployment",
        PROVIDER,
        &format!("/spec/template/spec/volumes/{i}/secret/secretName"),
        Value::from("cloudstack-secrets"),
    );
    assert_caught(check_cloudstack_secret(&b), "cloudstack-secrets");
    let j = volumes
        .iter()
        .position(|v| str_at(v, "/secret/secretName") == Some("cks-autoscaler-provider-tls"))
        .expect("tls volume");
    edit(
        &mut b,
        "Deployment",
        PROVIDER,
        &format!("/spec/template/spec/volumes/{j}/secret/secretName"),
        Value::from("cks-autoscaler-provider-tsl"),
    );
    assert_caught(check_provider_mounts(&b), "written by no Certificate");
}

#[test]
fn a_wrong_client_key_path_in_the_autoscaler_cloud_config_is_caught() {
    let r = rendered();
    let mut b = base(r);
    edit_cloud_config(&mut b, "/tls/ca.crt", "/client/ca.crt");
    assert_caught(check_autoscaler_wiring(&b), "`cacert`");
}

#[test]
fn an_address_the_server_certificate_does_not_cover_is_caught() {
    let r = rendered();
    let mut b = base(r);
    edit_cloud_config(
        &mut b,
        "cks-autoscaler-provider.kube-system.svc",
        "provider.kube-system.svc",
    );
    assert_caught(check_tls(&b), "do not include");
    assert_caught(check_autoscaler_wiring(&b), "does not name Service");
}

#[test]
fn certificates_from_different_issuers_are_caught() {
    let r = rendered();
    let mut b = base(r);
    edit(
        &mut b,
        "Certificate",
        "cks-cluster-autoscaler-grpc-client",
        "/spec/issuerRef/name",
        Value::from("cks-autoscaler-selfsigned"),
    );
    assert_caught(check_tls(&b), "different issuers");
}

#[test]
fn an_autoscaler_namespace_flag_without_its_variable_is_caught() {
    let r = rendered();
    let mut b = base(r);
    edit(
        &mut b,
        "Deployment",
        AUTOSCALER,
        "/spec/template/spec/containers/0/env",
        Value::Array(vec![]),
    );
    assert_caught(
        check_autoscaler_wiring(&b),
        "POD_NAMESPACE is not the pod's namespace",
    );
    set_arg(&mut b, AUTOSCALER, "--namespace=", "--v=2");
    assert_caught(check_autoscaler_wiring(&b), "--namespace is None");
}

#[test]
fn a_writable_root_filesystem_is_caught() {
    let r = rendered();
    let mut b = base(r);
    edit(
        &mut b,
        "Deployment",
        PROVIDER,
        "/spec/template/spec/containers/0/securityContext/readOnlyRootFilesystem",
        Value::Bool(false),
    );
    assert_caught(check_security(&b), "readOnlyRootFilesystem");
}

#[test]
fn an_unreadable_secret_mode_is_caught() {
    let r = rendered();
    let mut chart = r.set("helm-ci-default").clone();
    edit(
        &mut chart,
        "Deployment",
        PROVIDER,
        "/spec/template/spec/volumes/0/projected/defaultMode",
        Value::from(0o400),
    );
    assert_caught(check_security(&chart), "unreadable");
}

#[test]
fn a_latest_image_is_caught() {
    let r = rendered();
    let mut b = base(r);
    edit(
        &mut b,
        "Deployment",
        AUTOSCALER,
        "/spec/template/spec/containers/0/image",
        Value::from("registry.k8s.io/autoscaling/cluster-autoscaler:latest"),
    );
    assert_caught(check_images(&b), "not pinned");
}

#[test]
fn a_grpc_port_open_to_every_namespace_or_address_is_caught() {
    let r = rendered();
    let mut b = base(r);
    edit(
        &mut b,
        "NetworkPolicy",
        PROVIDER,
        "/spec/ingress/0/from/0",
        serde_json::json!({ "namespaceSelector": {} }),
    );
    assert_caught(check_network_policy(&b), "besides the autoscaler");
    let mut central = r.set("helm-examples-central-provider").clone();
    edit(
        &mut central,
        "NetworkPolicy",
        PROVIDER,
        "/spec/ingress/0/from/0",
        serde_json::json!({ "ipBlock": { "cidr": "0.0.0.0/0" } }),
    );
    let problems = check_network_policy(&central);
    assert_caught(problems.clone(), "besides the autoscaler");
    assert_caught(problems, "no autoscaler in this cluster");
}

#[test]
fn a_metrics_port_open_to_all_pods_is_caught() {
    let r = rendered();
    let mut b = base(r);
    edit(
        &mut b,
        "NetworkPolicy",
        PROVIDER,
        "/spec/ingress/1/from/0",
        serde_json::json!({ "namespaceSelector": {}, "podSelector": {} }),
    );
    assert_caught(check_network_policy(&b), "metrics port is open to all pods");
}

#[test]
fn a_binding_to_a_missing_role_or_a_missing_account_is_caught() {
    let r = rendered();
    let mut b = base(r);
    edit(
        &mut b,
        "ClusterRoleBinding",
        AUTOSCALER,
        "/roleRef/name",
        Value::from("cluster-autoscaler"),
    );
    assert_caught(check_identity(&b), "does not exist");
    // autoscaler.rbac.create=false still needs the account the Deployment names.
    let mut rbac_off = r.set("helm-ci-rbac-off").clone();
    assert_none("rbac off", check_identity(&rbac_off));
    rbac_off
        .docs
        .retain(|d| !(d.kind() == "ServiceAccount" && d.name() == AUTOSCALER));
    assert_caught(
        check_identity(&rbac_off),
        "ServiceAccount cks-cluster-autoscaler does not exist",
    );
}

#[test]
fn a_deployment_without_its_disruption_budget_is_caught() {
    let r = rendered();
    let mut b = base(r);
    b.docs
        .retain(|d| !(d.kind() == "PodDisruptionBudget" && d.name() == AUTOSCALER));
    assert_caught(check_identity(&b), "0 PodDisruptionBudgets select its pods");
}

#[test]
fn a_dockerfile_user_other_than_the_pod_user_or_an_unpinned_base_is_caught() {
    let r = rendered();
    let b = base(r);
    let dockerfile = fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    assert_caught(
        check_dockerfile(
            &b,
            &dockerfile.replace("USER 65532:65532", "USER 1000:1000"),
            "target\n.git\n",
        ),
        "runs as",
    );
    let digest = dockerfile
        .lines()
        .rfind(|l| l.starts_with("FROM "))
        .and_then(|l| l.split_once('@'))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .expect("final FROM has a digest")
        .to_string();
    assert_caught(
        check_dockerfile(
            &b,
            &dockerfile.replace(&format!("@{digest}"), ""),
            "target\n.git\n",
        ),
        "not pinned by digest",
    );
    assert_caught(
        check_dockerfile(
            &b,
            &dockerfile.replace("FROM --platform=$BUILDPLATFORM ", "FROM "),
            "target\n.git\n",
        ),
        "under emulation",
    );
    assert_caught(
        check_dockerfile(
            &b,
            &dockerfile.replace("arm64) target=aarch64", "arm64) target=x86_64"),
            "target\n.git\n",
        ),
        "TARGETARCH arm64",
    );
    assert_caught(
        check_dockerfile(&b, &dockerfile, "target\n.git\ntools\n"),
        "excludes tools",
    );
}

#[test]
fn a_missing_or_default_provision_time_is_caught() {
    let r = rendered();
    let mut b = base(r);
    set_arg(
        &mut b,
        AUTOSCALER,
        "--max-node-provision-time",
        "--max-node-provision-time=15m",
    );
    assert_caught(check_autoscaler_flags(&b), "expected 1500s");
    assert_caught(
        check_chart_matches_base(r.set("helm-ci-default"), &b),
        "autoscaler flags differ",
    );
    set_arg(&mut b, AUTOSCALER, "--max-node-provision-time", "--v=2");
    assert_caught(check_autoscaler_flags(&b), "no --max-node-provision-time");
}

#[test]
fn a_release_of_the_wrong_minor_or_a_drift_between_chart_and_components_is_caught() {
    let r = rendered();
    let readme = fs::read_to_string(repo().join("README.md")).expect("README.md");
    let mut values = chart_values();
    values["autoscaler"]["image"]["tagByKubernetesMinor"]["1.33"] = Value::from("v1.32.7");
    let problems = check_autoscaler_releases(r, &values, &readme);
    assert_caught(problems.clone(), "a release of another minor");
    assert_caught(
        problems.clone(),
        "differs from what the kustomize components render",
    );
    assert_caught(problems, "README's supported-releases table");
    let mut values = chart_values();
    if let Some(m) = values["autoscaler"]["image"]["tagByKubernetesMinor"].as_object_mut() {
        m.remove("1.30");
    }
    assert_caught(check_autoscaler_releases(r, &values, &readme), "have a gap");
    let mut values = chart_values();
    values["autoscaler"]["image"]["tag"] = Value::from("v1.35.2");
    assert_caught(
        check_autoscaler_releases(r, &values, &readme),
        "set by default",
    );
}

#[test]
fn rbac_or_certificates_drifting_between_chart_and_base_are_caught() {
    let r = rendered();
    let mut b = base(r);
    let rules = arr_at(
        &b.find("ClusterRole", AUTOSCALER).expect("ClusterRole").v,
        "/rules",
    )
    .to_vec();
    let i = rules
        .iter()
        .position(|rule| {
            strings_at(rule, "/resources")
                .iter()
                .any(|x| x == "volumeattachments")
        })
        .expect("a rule for volumeattachments");
    let mut trimmed = rules[i].clone();
    trimmed["resources"] = Value::from(vec!["storageclasses", "csinodes"]);
    edit(
        &mut b,
        "ClusterRole",
        AUTOSCALER,
        &format!("/rules/{i}"),
        trimmed,
    );
    assert_caught(check_identity(&b), "watch volumeattachments");
    let chart = r.set("helm-ci-default");
    assert_caught(
        check_chart_matches_base(chart, &b),
        "ClusterRole cks-cluster-autoscaler /rules differs",
    );
    let mut b = base(r);
    edit(
        &mut b,
        "Certificate",
        "cks-autoscaler-provider-tls",
        "/spec/dnsNames/0",
        Value::from("cks-provider"),
    );
    assert_caught(
        check_chart_matches_base(chart, &b),
        "Certificate cks-autoscaler-provider-tls /spec differs",
    );
    let mut b = base(r);
    b.docs.retain(|d| d.kind() != "PodDisruptionBudget");
    assert_caught(check_chart_matches_base(chart, &b), "PodDisruptionBudget");
}

#[test]
fn several_clusters_without_client_binding_are_caught() {
    let r = rendered();
    let mut central = r.set("helm-examples-central-provider").clone();
    assert_none("central", check_client_binding(&central));
    let first = flag_values(
        &strings_at(
            &central.find("Deployment", PROVIDER).expect("provider").v,
            "/spec/template/spec/containers/0/args",
        ),
        "nodes",
    )[0]
    .clone();
    let unbound = first.split('@').next().expect("group").to_string();
    set_arg(
        &mut central,
        PROVIDER,
        &format!("--nodes={first}"),
        &format!("--nodes={unbound}"),
    );
    assert_caught(check_client_binding(&central), "has no @CLIENT");
    set_arg(
        &mut central,
        PROVIDER,
        "--tls-client-ca",
        "--log-format=json",
    );
    assert_caught(check_client_binding(&central), "no --tls-client-ca");
}

#[test]
fn a_client_without_its_certificate_or_claiming_another_is_caught() {
    let r = rendered();
    let mut central = r.set("helm-examples-central-provider").clone();
    let cert = central
        .of_kind("Certificate")
        .find(|c| c.name().contains("-client-"))
        .expect("a remote client certificate")
        .name()
        .to_string();
    edit(
        &mut central,
        "Certificate",
        &cert,
        "/spec/dnsNames/0",
        Value::from("someone-else"),
    );
    edit(
        &mut central,
        "Certificate",
        &cert,
        "/spec/commonName",
        Value::from("someone-else"),
    );
    assert_caught(check_client_binding(&central), "no client certificate for");
    let mut b = base(r);
    edit(
        &mut b,
        "Deployment",
        AUTOSCALER,
        &format!(
            "/spec/template/metadata/annotations/{}",
            CLIENT_ANNOTATION.replace('/', "~1")
        ),
        Value::from("prod-a"),
    );
    assert_caught(check_client_binding(&b), "claims client prod-a");
}

#[test]
fn a_workload_cluster_dialing_what_the_central_provider_does_not_serve_is_caught() {
    let r = rendered();
    let central = r.set("helm-examples-central-provider");
    let mut workload = r.set("helm-examples-workload-cluster").clone();
    edit_cloud_config(
        &mut workload,
        "cks-provider.example.com:8086",
        "provider.example.com:443",
    );
    let problems = check_central_pair(central, &workload);
    assert_caught(problems.clone(), "does not name");
    assert_caught(problems, "dials port 443");
    let mut workload = r.set("helm-examples-workload-cluster").clone();
    edit(
        &mut workload,
        "Deployment",
        AUTOSCALER,
        &format!(
            "/spec/template/metadata/annotations/{}",
            CLIENT_ANNOTATION.replace('/', "~1")
        ),
        Value::from("prod-z.autoscalers.example.com"),
    );
    assert_caught(
        check_central_pair(central, &workload),
        "which no central --nodes binds",
    );
}

#[test]
fn a_provider_image_other_than_the_values_name_or_a_chart_rendering_without_one_is_caught() {
    let r = rendered();
    let by_digest = r
        .sets
        .iter()
        .find(|s| {
            s.source == "helm"
                && s.provider()
                    .is_ok_and(|p| str_at(p.container, "/image").is_some_and(|i| i.contains('@')))
        })
        .expect("a values file with image.digest");
    let mut tagged = by_digest.clone();
    let name = tagged.provider().expect("provider").doc.name().to_string();
    let image = str_at(tagged.provider().expect("provider").container, "/image")
        .expect("image")
        .to_string();
    let (repository, _) = image.split_once('@').expect("a digest");
    edit(
        &mut tagged,
        "Deployment",
        &name,
        "/spec/template/spec/containers/0/image",
        Value::from(format!("{repository}:0.1.0")),
    );
    assert_caught(check_provider_image(&tagged), "its values name");
    let mut refusals = r.refusals.clone();
    for refusal in refusals
        .iter_mut()
        .filter(|x| x.values.pointer("/image/repository").is_none())
    {
        refusal.refused = false;
    }
    assert_caught(
        check_image_refusal(&refusals),
        "rendered without image.repository",
    );
}

#[test]
fn a_provider_provision_time_other_than_the_autoscalers_is_caught() {
    let r = rendered();
    let mut b = base(r);
    assert_none("base", check_provision_times(&b));
    set_arg(
        &mut b,
        AUTOSCALER,
        "--max-node-provision-time",
        "--max-node-provision-time=30m",
    );
    assert_caught(check_provision_times(&b), "one value for both");
    set_arg(&mut b, PROVIDER, "--max-node-provision-time", "--v=2");
    assert_caught(
        check_provision_times(&b),
        "provider: no --max-node-provision-time",
    );
    let central = r.set("helm-examples-central-provider");
    let mut workload = r.set("helm-examples-workload-cluster").clone();
    set_arg(
        &mut workload,
        AUTOSCALER,
        "--max-node-provision-time",
        "--max-node-provision-time=40m",
    );
    assert_caught(
        check_central_pair(central, &workload),
        "the central provider's --max-node-provision-time",
    );
}

#[test]
fn an_autoscaler_metrics_service_on_another_port_or_drifting_alerts_are_caught() {
    let r = rendered();
    let mut b = base(r);
    edit(
        &mut b,
        "Service",
        AUTOSCALER,
        "/spec/ports/0/targetPort",
        Value::from(9090),
    );
    assert_caught(check_metrics_services(&b), "reaches container port");
    let with_monitors = r
        .sets
        .iter()
        .find(|s| s.of_kind("PrometheusRule").next().is_some())
        .expect("a values file with the PrometheusRule");
    let autoscaler = with_monitors
        .autoscaler()
        .expect("autoscaler")
        .doc
        .name()
        .to_string();
    let mut unscraped = with_monitors.clone();
    unscraped
        .docs
        .retain(|d| !(d.kind() == "ServiceMonitor" && d.name() == autoscaler));
    assert_caught(
        check_metrics_services(&unscraped),
        "none scrapes the autoscaler's Service",
    );
    let docs = docs_rule_groups();
    let rule = with_monitors
        .of_kind("PrometheusRule")
        .next()
        .expect("rule")
        .name()
        .to_string();
    let mut drifted = with_monitors.clone();
    edit(
        &mut drifted,
        "PrometheusRule",
        &rule,
        "/spec/groups/0/rules/0/for",
        Value::from("1m"),
    );
    assert_caught(check_prometheus_rule(&drifted, &docs), "differs from docs");
    let mut fewer = with_monitors.clone();
    if let Some(rules) = fewer
        .docs
        .iter_mut()
        .find(|d| d.kind() == "PrometheusRule")
        .and_then(|d| d.v.pointer_mut("/spec/groups/0/rules"))
        .and_then(Value::as_array_mut)
    {
        rules.pop();
    }
    assert_caught(
        check_prometheus_rule(&fewer, &docs),
        "docs/prometheus-rules.yaml has",
    );
    let mut elsewhere = with_monitors.clone();
    elsewhere.docs.retain(|d| d.kind() != "ServiceMonitor");
    assert_caught(
        check_prometheus_rule(&elsewhere, &docs),
        "which no ServiceMonitor of the set scrapes",
    );
}

#[test]
fn service_links_a_mount_without_its_volume_or_lost_extra_args_are_caught() {
    let r = rendered();
    let mut b = base(r);
    edit(
        &mut b,
        "Deployment",
        AUTOSCALER,
        "/spec/template/spec/enableServiceLinks",
        Value::Bool(true),
    );
    assert_caught(check_pod_extras(&b), "enableServiceLinks");
    let parity = r.set("helm-ci-parity-options");
    let mut unmounted = parity.clone();
    let name = unmounted
        .autoscaler()
        .expect("autoscaler")
        .doc
        .name()
        .to_string();
    edit(
        &mut unmounted,
        "Deployment",
        &name,
        "/spec/template/spec/volumes",
        Value::Array(vec![]),
    );
    assert_caught(
        check_pod_extras(&unmounted),
        "which the pod does not define",
    );
    let mut lost = parity.clone();
    let provider = lost.provider().expect("provider").doc.name().to_string();
    let last = strings_at(
        &lost.find("Deployment", &provider).expect("provider").v,
        "/spec/template/spec/containers/0/args",
    )
    .last()
    .cloned()
    .expect("an argument");
    set_arg(&mut lost, &provider, &last, "--log-format=json");
    assert_caught(check_pod_extras(&lost), "are not the end of its arguments");
    assert_eq!(
        expected_extra_args(&serde_json::json!({"b_2": "y", "a": null, "b": ["x"], "c": false})),
        vec!["--a", "--b=x", "--b=y", "--c=false"]
    );
}

#[test]
fn a_state_role_without_update_or_a_pod_without_its_token_is_caught() {
    let r = rendered();
    let mut b = base(r);
    edit(
        &mut b,
        "Role",
        "cks-autoscaler-provider-state",
        "/rules/0/verbs",
        serde_json::json!(["get"]),
    );
    assert_caught(check_provider_rbac(&b), "update configmap");
    let mut b = base(r);
    edit(
        &mut b,
        "Deployment",
        PROVIDER,
        "/spec/template/spec/automountServiceAccountToken",
        Value::Bool(false),
    );
    assert_caught(check_security(&b), "automountServiceAccountToken");
}

// ---------------------------------------------------------------------------------------------
// Certificates without cert-manager (components/own-certificates)

/// The Secrets a run of commands creates, from the `kubectl … create secret generic NAME
/// --from-file=KEY=FILE …` calls it made: each name with its keys.
type CreatedSecrets = BTreeMap<String, BTreeSet<String>>;

/// Runs `script` with `sh` in a directory of its own, with stand-ins for `openssl` (does
/// nothing) and `kubectl` (records its arguments and succeeds), and returns the Secrets it
/// created and every `kubectl` call.
fn run_with_stand_ins(script: &str, args: &[&str]) -> (CreatedSecrets, Vec<String>) {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "own-certificates-{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    fs::create_dir_all(&dir).expect("stand-in directory");
    let log = dir.join("kubectl.log");
    let _ = fs::remove_file(&log);
    // A CA file and key for the script's checks: the stand-in openssl never reads them.
    fs::write(dir.join("ca.crt"), "").expect("ca.crt");
    fs::write(dir.join("ca.key"), "").expect("ca.key");
    let kubectl = format!("printf '%s\\n' \"$*\" >> '{}'\nexit 0", log.display());
    crate::deploy_certs::sh_with_stubs(
        &dir,
        &[("openssl", "exit 0"), ("kubectl", &kubectl)],
        script,
        args,
    );
    let calls: Vec<String> = fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    let mut created = CreatedSecrets::new();
    for call in &calls {
        let words: Vec<&str> = call.split_whitespace().collect();
        let Some(at) = words
            .windows(3)
            .position(|w| w == ["create", "secret", "generic"])
        else {
            continue;
        };
        let Some(name) = words.get(at + 3) else {
            continue;
        };
        let keys = words
            .iter()
            .filter_map(|w| w.strip_prefix("--from-file="))
            .filter_map(|f| f.split_once('=').map(|(k, _)| k.to_string()))
            .collect();
        created.insert(name.to_string(), keys);
    }
    (created, calls)
}

/// The shell block of the operations guide's "Without cert-manager" section.
fn documented_commands() -> String {
    let guide = fs::read_to_string(repo().join("docs/operations.md")).expect("operations guide");
    let section = guide
        .split_once("### 5.4 Without cert-manager")
        .map(|(_, rest)| rest)
        .expect("the guide has §5.4");
    let block = section
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(block, _)| block)
        .expect("§5.4 has a shell block");
    block.to_string()
}

/// What the own-certificates component must give: no cert-manager object left; the provider's
/// TLS flags and the autoscaler's cloud-config read the files of Secrets `created` holds, each
/// file from the key the commands put it under.
fn check_own_certificates(s: &Set, created: &CreatedSecrets) -> Vec<String> {
    let mut problems = Vec::new();
    for d in &s.docs {
        if str_at(&d.v, "/apiVersion").is_some_and(|a| a.starts_with("cert-manager.io/")) {
            problems.push(format!("{} is a cert-manager object", d.id()));
        }
    }
    let check = |who: &str, w: &Workload<'_>, path: Option<String>, want_key: &str| {
        let Some(path) = path else {
            return Some(format!("{who}: not set"));
        };
        match resolve_path(w.pod, w.container, &path) {
            Ok(FileSource::Secret { name, key }) => match created.get(&name) {
                None => Some(format!(
                    "{who} {path}: Secret {name}, which the documented commands do not create \
                     (they create {:?})",
                    created.keys().collect::<Vec<_>>()
                )),
                Some(keys) if !keys.contains(&key) || key != want_key => Some(format!(
                    "{who} {path}: key {key} of Secret {name}, expected {want_key} (created: {keys:?})"
                )),
                Some(_) => None,
            },
            Ok(other) => Some(format!("{who} {path}: from {other:?}, not a Secret")),
            Err(e) => Some(format!("{who}: {e}")),
        }
    };
    match s.provider() {
        Ok(p) => {
            let args = p.args();
            for (f, key) in [
                ("tls-cert", "tls.crt"),
                ("tls-key", "tls.key"),
                ("tls-client-ca", "ca.crt"),
            ] {
                problems.extend(check(&format!("provider --{f}"), &p, flag(&args, f), key));
            }
        }
        Err(e) => problems.push(e),
    }
    match (s.autoscaler(), s.autoscaler_cloud_config()) {
        (Ok(a), Ok(cc)) => {
            for (f, key) in [
                ("cert", "tls.crt"),
                ("key", "tls.key"),
                ("cacert", "ca.crt"),
            ] {
                let path = str_at(&cc, &format!("/{f}")).map(str::to_string);
                problems.extend(check(
                    &format!("autoscaler cloud-config {f}"),
                    &a,
                    path,
                    key,
                ));
            }
        }
        (Err(e), _) | (_, Err(e)) => problems.push(e),
    }
    problems
}

const OWN_CERTIFICATES: &str = "kustomize-components-own-certificates";

#[test]
fn own_certificates_mount_the_secrets_the_documented_commands_and_the_script_create() {
    let r = rendered();
    let s = r.set(OWN_CERTIFICATES);
    let (documented, _) = run_with_stand_ins(&documented_commands(), &[]);
    let script = repo().join("deploy/kustomize/components/own-certificates/renew.sh");
    let (renewed, calls) = run_with_stand_ins(
        &format!("exec sh '{}' \"$@\"", script.display()),
        &["--ca-cert", "ca.crt", "--ca-key", "ca.key"],
    );
    let tls_keys: BTreeSet<String> = CERT_MANAGER_KEYS.iter().map(|k| k.to_string()).collect();
    assert_eq!(
        documented.values().collect::<Vec<_>>(),
        [&tls_keys, &tls_keys],
        "the documented commands create two Secrets with tls.crt, tls.key and ca.crt: {documented:?}"
    );
    assert_eq!(
        renewed, documented,
        "renew.sh replaces the Secrets the documented commands create"
    );
    assert_none("own certificates", check_own_certificates(s, &documented));
    // The script restarts the autoscaler of the set (it reads its client certificate once)
    // and nothing else.
    let autoscaler = s
        .autoscaler()
        .expect("an autoscaler")
        .doc
        .name()
        .to_string();
    let restarts: Vec<&String> = calls.iter().filter(|c| c.contains("rollout")).collect();
    assert_eq!(
        restarts,
        [&format!(
            "-n kube-system rollout restart deploy/{autoscaler}"
        )],
        "{calls:#?}"
    );
    // Only the server certificate: nothing restarted (the provider re-reads its files).
    let (server_only, calls) = run_with_stand_ins(
        &format!("exec sh '{}' \"$@\"", script.display()),
        &["--ca-cert", "ca.crt", "--ca-key", "ca.key", "--server-only"],
    );
    assert_eq!(
        server_only.keys().collect::<Vec<_>>(),
        ["cks-autoscaler-provider-tls"]
    );
    assert!(!calls.iter().any(|c| c.contains("rollout")), "{calls:#?}");
}

#[test]
fn a_cert_manager_object_or_a_secret_nobody_creates_is_caught() {
    let r = rendered();
    let (documented, _) = run_with_stand_ins(&documented_commands(), &[]);
    let good = r.set(OWN_CERTIFICATES);
    assert_none("as rendered", check_own_certificates(good, &documented));
    // cert-manager's Certificate left in.
    let mut b = good.clone();
    let base = r.set("kustomize-base");
    b.docs.extend(base.of_kind("Certificate").cloned());
    assert_caught(
        check_own_certificates(&b, &documented),
        "is a cert-manager object",
    );
    // The provider mounting a Secret of another name.
    let mut b = good.clone();
    for d in &mut b.docs {
        if d.kind() == "Deployment" && d.name() == "cks-autoscaler-provider" {
            for v in
                d.v.pointer_mut("/spec/template/spec/volumes")
                    .and_then(Value::as_array_mut)
                    .expect("volumes")
            {
                if v.pointer("/name") == Some(&Value::from("tls")) {
                    v["secret"]["secretName"] = Value::from("provider-certs");
                }
            }
        }
    }
    assert_caught(
        check_own_certificates(&b, &documented),
        "Secret provider-certs, which the documented commands do not create",
    );
}

/// One of the guide's `kubectl exec … probe` commands (§5.3), read from its shell block.
struct InPodProbe {
    namespace: String,
    selector: BTreeMap<String, String>,
    container: String,
    address: String,
    cacert: String,
}

/// The shell block after `heading` in the guide, its `ns=`/`release=` assignments substituted.
fn in_pod_probe(guide: &str, heading: &str) -> Result<InPodProbe, String> {
    let at = guide
        .find(heading)
        .ok_or_else(|| format!("the guide has no {heading:?}"))?;
    let rest = &guide[at..];
    let start = rest.find("```sh\n").ok_or("no shell block after it")? + 6;
    let block = &rest[start..];
    let block = &block[..block.find("\n```").ok_or("the block does not end")?];
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    for assignment in block.lines().next().unwrap_or("").split(';').map(str::trim) {
        if let Some((k, v)) = assignment.split_once('=') {
            vars.insert(k.to_string(), v.to_string());
        }
    }
    let mut text = block.replace("\\\n", " ");
    for (k, v) in &vars {
        text = text.replace(&format!("${k}"), v);
    }
    let words: Vec<&str> = text.split_whitespace().collect();
    let after = |flag: &str| {
        words
            .iter()
            .position(|w| *w == flag)
            .and_then(|i| words.get(i + 1))
            .map(|w| w.trim_end_matches(')').to_string())
            .ok_or_else(|| format!("no {flag} in {text}"))
    };
    let selector = after("-l")?
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Ok(InPodProbe {
        namespace: vars.get("ns").cloned().ok_or("no ns=")?,
        selector,
        container: after("-c")?,
        address: after("--address")?,
        cacert: after("--cacert")?,
    })
}

/// The pod the command picks is the leader's provider pod of the render, in its namespace; the
/// container is the provider's; the address is the `--admin-listen` port by the name the server
/// certificate carries; the CA file is mounted in that container.
fn check_in_pod_probe(s: &Set, cmd: &InPodProbe) -> Vec<String> {
    let mut problems = Vec::new();
    let p = match s.provider() {
        Ok(p) => p,
        Err(e) => return vec![e],
    };
    let ns = str_at(&p.doc.v, "/metadata/namespace").unwrap_or(&s.namespace);
    if cmd.namespace != ns {
        problems.push(format!(
            "the command looks in namespace {}, the provider runs in {ns}",
            cmd.namespace
        ));
    }
    if !selects(&cmd.selector, &p.serving_labels()) {
        problems.push(format!(
            "-l {:?} does not select the leader's provider pod {:?}",
            cmd.selector,
            p.serving_labels()
        ));
    }
    if str_at(p.container, "/name") != Some(cmd.container.as_str()) {
        problems.push(format!(
            "-c {} is not the provider's container {:?}",
            cmd.container,
            str_at(p.container, "/name")
        ));
    }
    match flag(&p.args(), "admin-listen") {
        None => problems.push("the provider runs without --admin-listen".into()),
        Some(listen) => {
            if !host_of(&listen).is_some_and(|h| h == "127.0.0.1" || h == "::1") {
                problems.push(format!("--admin-listen={listen} is not loopback"));
            }
            if port_of(&listen) != port_of(&cmd.address) {
                problems.push(format!(
                    "--address {} is not the --admin-listen={listen} port",
                    cmd.address
                ));
            }
        }
    }
    if host_of(&cmd.address) != Some("localhost") {
        problems.push(format!(
            "--address {}: the server certificate names localhost, no IP address",
            cmd.address
        ));
    }
    if let Err(e) = resolve_path(p.pod, p.container, &cmd.cacert) {
        problems.push(format!("--cacert {e}"));
    }
    problems
}

#[test]
fn the_guides_in_pod_probe_commands_reach_the_admin_address_of_their_render() {
    let r = rendered();
    let guide = fs::read_to_string(repo().join("docs/operations.md")).expect("guide");
    for (heading, set) in [
        (
            "The kustomize base (namespace `kube-system`):",
            "kustomize-base",
        ),
        (
            "The Helm chart (set `ns` to the release's namespace and `release` to its name):",
            "helm-ci-default",
        ),
    ] {
        let cmd = in_pod_probe(&guide, heading).unwrap_or_else(|e| panic!("{heading} {e}"));
        assert_none(set, check_in_pod_probe(r.set(set), &cmd));
        // The check notices a command aimed at another port or container.
        let mut wrong = in_pod_probe(&guide, heading).expect("parsed above");
        wrong.address = "localhost:1".into();
        wrong.container = "cluster-autoscaler".into();
        let caught = check_in_pod_probe(r.set(set), &wrong);
        assert!(
            caught.iter().any(|p| p.contains("--admin-listen"))
                && caught.iter().any(|p| p.contains("-c cluster-autoscaler")),
            "{caught:?}"
        );
    }
}
