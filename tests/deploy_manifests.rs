//! Wiring checks for `deploy/`, the Dockerfile and the Helm chart: the parts an operator applies
//! must agree with each other, or the autoscaler never reaches the provider.
//!
//! Every YAML document under `deploy/kustomize` is parsed (as Kubernetes reads it: YAML 1.1
//! octal numbers). The checks then follow the references an apiserver, kubelet or cert-manager
//! would follow: ports (container, Service, probes, NetworkPolicy, the autoscaler's `address`),
//! Secret and ConfigMap names and keys behind every mounted path given in the arguments, the
//! server certificate's names against the host the autoscaler dials, security contexts, image
//! tags, RBAC subjects and rules, kustomize overlays and components, the autoscaler release per
//! Kubernetes minor and its flags, and the Dockerfile's user, ports and binary path.
//!
//! Each check returns the problems it found, so the `*_is_caught` tests can break one piece of
//! wiring in memory and show that the check notices.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const PROVIDER_BINARY: &str = "/usr/local/bin/cks-autoscaler-provider";
const CERT_MANAGER_KEYS: [&str; 3] = ["tls.crt", "tls.key", "ca.crt"];

// ---------------------------------------------------------------------------------------------
// Loading

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn kustomize_dir() -> PathBuf {
    repo().join("deploy/kustomize")
}

fn base_dir() -> PathBuf {
    kustomize_dir().join("base")
}

fn chart_dir() -> PathBuf {
    repo().join("deploy/helm/cks-autoscaler-provider")
}

/// Parses every document of a YAML file. Kubernetes' YAML reader takes `0440` as octal, so
/// this one does too.
fn parse_yaml(text: &str) -> Result<Vec<Value>, String> {
    let options = serde_saphyr::options! { legacy_octal_numbers: true };
    serde_saphyr::from_multiple_with_options::<Value>(text, options).map_err(|e| e.to_string())
}

fn load_yaml(path: &Path) -> Result<Vec<Value>, String> {
    let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_yaml(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn yaml_files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            ) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

#[derive(Clone, Debug)]
struct Doc {
    file: String,
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
        format!("{} {} ({})", self.kind(), self.name(), self.file)
    }
}

/// The kustomize base as kustomize would assemble it (resources plus the `namespace` and
/// `images` settings), and the example objects an operator provides outside the base.
#[derive(Clone, Debug)]
struct Base {
    kustomization: Value,
    namespace: String,
    docs: Vec<Doc>,
    external: Vec<Doc>,
}

fn load_base() -> Base {
    let dir = base_dir();
    let kustomization = load_yaml(&dir.join("kustomization.yaml"))
        .expect("base kustomization parses")
        .into_iter()
        .next()
        .expect("base kustomization has a document");
    let namespace = str_at(&kustomization, "/namespace")
        .unwrap_or("default")
        .to_string();
    let mut docs = Vec::new();
    for res in strings_at(&kustomization, "/resources") {
        // A missing file is reported by check_kustomization_files; skip it here.
        let Ok(values) = load_yaml(&dir.join(&res)) else {
            continue;
        };
        docs.extend(values.into_iter().map(|v| Doc {
            file: res.clone(),
            v,
        }));
    }
    let mut external = Vec::new();
    for path in yaml_files_under(&kustomize_dir().join("examples")) {
        let file = path.display().to_string();
        for v in load_yaml(&path).expect("example parses") {
            external.push(Doc {
                file: file.clone(),
                v,
            });
        }
    }
    Base {
        kustomization,
        namespace,
        docs,
        external,
    }
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

// ---------------------------------------------------------------------------------------------
// The objects the checks are about

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
}

impl Base {
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
                    let pod = d.v.pointer("/spec/template/spec").expect("pod spec");
                    return Ok(Workload {
                        doc: d,
                        pod,
                        container: c,
                    });
                }
            }
        }
        Err(format!("no Deployment runs the {what}"))
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

    /// The Service that selects the provider's pods.
    fn provider_service(&self) -> Result<&Doc, String> {
        let p = self.provider()?;
        let labels = p.pod_labels();
        self.of_kind("Service")
            .find(|s| selects(&labels_at(&s.v, "/spec/selector"), &labels))
            .ok_or_else(|| "no Service selects the provider's pods".to_string())
    }

    /// The keys a Secret of this name will have: a cert-manager Certificate writes tls.crt,
    /// tls.key and ca.crt; a Secret object (in the base or the examples) has its own keys.
    fn secret_keys(&self, name: &str) -> Option<BTreeSet<String>> {
        if self
            .of_kind("Certificate")
            .any(|c| str_at(&c.v, "/spec/secretName") == Some(name))
        {
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
// Checks on the kustomize base

/// Every resource a kustomization lists exists and parses, every YAML file in the directory is
/// listed (nothing silently left out), and every document is a Kubernetes object.
fn check_kustomization_files(dir: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let k = match load_yaml(&dir.join("kustomization.yaml")) {
        Ok(docs) => docs.into_iter().next().unwrap_or(Value::Null),
        Err(e) => return vec![e],
    };
    let mut listed = BTreeSet::new();
    let mut entries = strings_at(&k, "/resources");
    entries.extend(
        arr_at(&k, "/patches")
            .iter()
            .filter_map(|p| str_at(p, "/path").map(str::to_string)),
    );
    for res in &entries {
        let path = dir.join(res);
        if path.is_dir() {
            if !path.join("kustomization.yaml").is_file() {
                problems.push(format!(
                    "{}: {res} has no kustomization.yaml",
                    dir.display()
                ));
            }
            continue;
        }
        if !path.is_file() {
            problems.push(format!("{}: resource {res} does not exist", dir.display()));
            continue;
        }
        listed.insert(res.clone());
        match load_yaml(&path) {
            Err(e) => problems.push(e),
            Ok(docs) if docs.is_empty() => problems.push(format!("{res}: no document")),
            Ok(docs) => {
                for d in docs {
                    // JSON6902 patches are lists of operations, not objects.
                    if d.is_array() {
                        continue;
                    }
                    if str_at(&d, "/apiVersion").is_none()
                        || str_at(&d, "/kind").is_none()
                        || str_at(&d, "/metadata/name").is_none()
                    {
                        problems.push(format!(
                            "{res}: a document lacks apiVersion, kind or metadata.name"
                        ));
                    }
                }
            }
        }
    }
    for path in yaml_files_under(dir) {
        if path.parent() != Some(dir) {
            continue;
        }
        let file = path.file_name().and_then(|f| f.to_str()).unwrap_or("");
        if file != "kustomization.yaml" && !listed.contains(file) {
            problems.push(format!(
                "{}: {file} is not listed in kustomization.yaml",
                dir.display()
            ));
        }
    }
    problems
}

/// gRPC and metrics ports agree across the provider's flags, its container ports, the Service,
/// the probes and the autoscaler's `address`.
fn check_ports(b: &Base) -> Vec<String> {
    let mut problems = Vec::new();
    let p = match b.provider() {
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
    let svc = match b.provider_service() {
        Ok(s) => s,
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
        } else if let Some(grpc) = pr.pointer("/grpc") {
            let port = grpc.pointer("/port").and_then(Value::as_u64);
            if port != Some(listen) {
                problems.push(format!(
                    "provider {probe} gRPC probe on port {port:?}, gRPC listens on {listen}"
                ));
            }
        } else {
            problems.push(format!("provider {probe} is neither httpGet nor grpc"));
        }
    }
    match b.autoscaler_cloud_config() {
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
    problems
}

/// Every file the provider's flags name is mounted, from a Secret or ConfigMap key that exists.
fn check_provider_mounts(b: &Base) -> Vec<String> {
    let mut problems = Vec::new();
    let p = match b.provider() {
        Ok(p) => p,
        Err(e) => return vec![e],
    };
    let args = p.args();
    let expect = [
        ("cloud-config", None),
        ("tls-cert", Some("tls.crt")),
        ("tls-key", Some("tls.key")),
        ("tls-client-ca", Some("ca.crt")),
    ];
    let mut tls_secrets = BTreeSet::new();
    for (name, want_key) in expect {
        let Some(path) = flag(&args, name) else {
            problems.push(format!("provider has no --{name}"));
            continue;
        };
        match resolve_path(p.pod, p.container, &path) {
            Err(e) => problems.push(format!("provider --{name}: {e}")),
            Ok(FileSource::ConfigMap { name: cm, key }) => problems.push(format!(
                "provider --{name} {path} comes from ConfigMap {cm} key {key}; it must be a Secret"
            )),
            Ok(FileSource::Secret { name: secret, key }) => {
                match b.secret_keys(&secret) {
                    None => problems.push(format!(
                        "provider --{name} {path}: Secret {secret} is neither created by a Certificate nor described in deploy/kustomize/examples"
                    )),
                    Some(keys) if !keys.contains(&key) => problems.push(format!(
                        "provider --{name} {path}: Secret {secret} has no key {key} (it has {keys:?})"
                    )),
                    Some(_) => {}
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

/// The autoscaler runs externalgrpc with a cloud-config whose client certificate paths are the
/// mounted client Certificate's Secret, and whose address names the provider's Service.
fn check_autoscaler_wiring(b: &Base) -> Vec<String> {
    let mut problems = Vec::new();
    let a = match b.autoscaler() {
        Ok(a) => a,
        Err(e) => return vec![e],
    };
    if !flag_values(&a.args(), "nodes").is_empty() {
        problems.push(
            "autoscaler: --nodes has no effect with externalgrpc; the provider takes it".into(),
        );
    }
    let cc = match b.autoscaler_cloud_config() {
        Ok(cc) => cc,
        Err(e) => return vec![e],
    };
    let mut client_secrets = BTreeSet::new();
    for (field, want_key) in [
        ("key", "tls.key"),
        ("cert", "tls.crt"),
        ("cacert", "ca.crt"),
    ] {
        let Some(path) = str_at(&cc, &format!("/{field}")) else {
            problems.push(format!("autoscaler cloud-config has no `{field}`"));
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
                let cert = b
                    .of_kind("Certificate")
                    .find(|c| str_at(&c.v, "/spec/secretName") == Some(name.as_str()));
                match cert {
                    None => problems.push(format!(
                        "autoscaler cloud-config `{field}`: Secret {name} is not written by any Certificate"
                    )),
                    Some(c) if !strings_at(&c.v, "/spec/usages").iter().any(|u| u == "client auth") => {
                        problems.push(format!("{} lacks the `client auth` usage", c.id()))
                    }
                    Some(_) => {}
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
    match (host_of(address), b.provider_service()) {
        (None, _) => problems.push(format!("autoscaler address {address:?} is not host:port")),
        (_, Err(e)) => problems.push(e),
        (Some(host), Ok(svc)) => {
            let labels: Vec<&str> = host.split('.').collect();
            if labels[0] != svc.name() {
                problems.push(format!(
                    "autoscaler address host {host} does not name Service {}",
                    svc.name()
                ));
            }
            if labels.len() > 1 && labels[1] != b.namespace {
                problems.push(format!(
                    "autoscaler address host {host} is in namespace {}, the base deploys to {}",
                    labels[1], b.namespace
                ));
            }
            if labels.len() > 2 && labels[2] != "svc" {
                problems.push(format!(
                    "autoscaler address host {host} is not a Service name"
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

/// The server certificate covers the host the autoscaler dials and is issued by the same CA the
/// client certificate is, and that CA issuer is backed by a CA Certificate.
fn check_tls(b: &Base) -> Vec<String> {
    let mut problems = Vec::new();
    let p = match b.provider() {
        Ok(p) => p,
        Err(e) => return vec![e],
    };
    let server_secret = match flag(&p.args(), "tls-cert")
        .ok_or_else(|| "provider has no --tls-cert".to_string())
        .and_then(|path| resolve_path(p.pod, p.container, &path))
    {
        Ok(FileSource::Secret { name, .. }) => name,
        Ok(other) => return vec![format!("provider --tls-cert comes from {other:?}")],
        Err(e) => return vec![e],
    };
    let Some(server) = b
        .of_kind("Certificate")
        .find(|c| str_at(&c.v, "/spec/secretName") == Some(server_secret.as_str()))
    else {
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
    let cc = match b.autoscaler_cloud_config() {
        Ok(cc) => cc,
        Err(e) => return vec![e],
    };
    let address = str_at(&cc, "/address").unwrap_or("");
    let dns = strings_at(&server.v, "/spec/dnsNames");
    match host_of(address) {
        Some(host) if dns.iter().any(|d| d == host) => {}
        host => problems.push(format!(
            "{} dnsNames {dns:?} do not include {host:?}, the host the autoscaler verifies",
            server.id()
        )),
    }
    // The autoscaler's client certificate must chain to the CA the provider trusts.
    let a = match b.autoscaler() {
        Ok(a) => a,
        Err(e) => return vec![e],
    };
    let client_secret = str_at(&cc, "/cert")
        .ok_or_else(|| "autoscaler cloud-config has no cert".to_string())
        .and_then(|path| resolve_path(a.pod, a.container, path));
    if let Ok(FileSource::Secret { name, .. }) = client_secret
        && let Some(client) = b
            .of_kind("Certificate")
            .find(|c| str_at(&c.v, "/spec/secretName") == Some(name.as_str()))
        && server.v.pointer("/spec/issuerRef") != client.v.pointer("/spec/issuerRef")
    {
        problems.push(format!(
            "{} and {} come from different issuers: neither side would trust the other",
            server.id(),
            client.id()
        ));
    }
    // Follow issuerRefs: every Issuer exists; a CA issuer's secret is written by an isCA
    // Certificate.
    for cert in b.of_kind("Certificate") {
        let kind = str_at(&cert.v, "/spec/issuerRef/kind").unwrap_or("Issuer");
        let name = str_at(&cert.v, "/spec/issuerRef/name").unwrap_or("");
        let Some(issuer) = b.find(kind, name) else {
            problems.push(format!(
                "{}: issuer {kind} {name} does not exist",
                cert.id()
            ));
            continue;
        };
        if let Some(ca_secret) = str_at(&issuer.v, "/spec/ca/secretName") {
            let backed = b.of_kind("Certificate").any(|c| {
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

/// Both pods run non-root with a read-only root filesystem, no privilege escalation, no
/// capabilities, the RuntimeDefault seccomp profile, read-only mounts the user can read, and
/// resource requests and memory limits.
fn check_security(b: &Base) -> Vec<String> {
    let mut problems = Vec::new();
    for d in b.of_kind("Deployment") {
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
            if let Some(secret) = v.pointer("/secret") {
                let default_mode = secret
                    .pointer("/defaultMode")
                    .and_then(Value::as_u64)
                    .unwrap_or(0o644);
                let mut modes = vec![default_mode];
                modes.extend(
                    arr_at(secret, "/items")
                        .iter()
                        .filter_map(|i| i.pointer("/mode").and_then(Value::as_u64)),
                );
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
            for m in arr_at(c, "/volumeMounts") {
                if m.pointer("/readOnly") != Some(&Value::Bool(true)) {
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
    // The provider never calls the Kubernetes API: no token in its pod.
    if let Ok(p) = b.provider()
        && p.pod.pointer("/automountServiceAccountToken") != Some(&Value::Bool(false))
    {
        problems.push("provider pod mounts a service account token it never uses".into());
    }
    problems
}

/// The image a container runs once the kustomization's `images` settings are applied.
fn effective_image(b: &Base, image: &str) -> String {
    let name = image_name(image);
    for i in arr_at(&b.kustomization, "/images") {
        if str_at(i, "/name") == Some(name) {
            let new_name = str_at(i, "/newName").unwrap_or(name);
            if let Some(digest) = str_at(i, "/digest") {
                return format!("{new_name}@{digest}");
            }
            let tag = i
                .pointer("/newTag")
                .map(scalar)
                .or_else(|| image_tag(image).map(str::to_string));
            return match tag {
                Some(t) => format!("{new_name}:{t}"),
                None => new_name.to_string(),
            };
        }
    }
    image.to_string()
}

/// Images are pinned to a tag (or digest) that is not `latest`, before and after the
/// kustomization's `images`; the provider runs the crate's own version.
fn check_images(b: &Base) -> Vec<String> {
    let mut problems = Vec::new();
    let pinned = |image: &str| -> bool {
        image.contains("@sha256:") || image_tag(image).is_some_and(|t| t != "latest")
    };
    for d in b.of_kind("Deployment") {
        for c in arr_at(&d.v, "/spec/template/spec/containers") {
            let image = str_at(c, "/image").unwrap_or("");
            let effective = effective_image(b, image);
            for shown in [image, effective.as_str()] {
                if !pinned(shown) {
                    problems.push(format!(
                        "{}: image {shown:?} is not pinned to a tag",
                        d.id()
                    ));
                }
            }
            if str_at(c, "/imagePullPolicy") == Some("Always") {
                problems.push(format!(
                    "{}: imagePullPolicy Always with a pinned tag",
                    d.id()
                ));
            }
        }
    }
    if let Ok(p) = b.provider() {
        let effective = effective_image(b, str_at(p.container, "/image").unwrap_or(""));
        let want = env!("CARGO_PKG_VERSION");
        if image_tag(&effective) != Some(want) {
            problems.push(format!(
                "provider image {effective} does not carry the crate version {want}"
            ));
        }
    }
    problems
}

/// The NetworkPolicy admits only the autoscaler's pods to the gRPC port and only a selected
/// monitoring peer to the metrics port.
fn check_network_policy(b: &Base) -> Vec<String> {
    let mut problems = Vec::new();
    let (p, a) = match (b.provider(), b.autoscaler()) {
        (Ok(p), Ok(a)) => (p, a),
        (Err(e), _) | (_, Err(e)) => return vec![e],
    };
    let args = p.args();
    let listen = flag(&args, "listen").and_then(|l| port_of(&l));
    let metrics = flag(&args, "metrics-listen").and_then(|l| port_of(&l));
    let provider_labels = p.pod_labels();
    let autoscaler_labels = a.pod_labels();
    let policies: Vec<&Doc> = b
        .of_kind("NetworkPolicy")
        .filter(|np| {
            selects(
                &labels_at(&np.v, "/spec/podSelector/matchLabels"),
                &provider_labels,
            )
        })
        .collect();
    if policies.is_empty() {
        return vec!["no NetworkPolicy selects the provider's pods".into()];
    }
    let mut grpc_admits_autoscaler = false;
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
                    let only_autoscaler = peer.pointer("/namespaceSelector").is_none()
                        && peer.pointer("/ipBlock").is_none()
                        && selects(&sel, &autoscaler_labels);
                    if only_autoscaler {
                        grpc_admits_autoscaler = true;
                    } else {
                        problems.push(format!(
                            "{}: the gRPC port is open to {peer} besides the autoscaler",
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
    if !grpc_admits_autoscaler {
        problems.push(format!(
            "no NetworkPolicy rule admits the autoscaler ({autoscaler_labels:?}) to gRPC port {listen:?}"
        ));
    }
    if !metrics_admitted {
        problems.push(format!(
            "no NetworkPolicy rule admits Prometheus to metrics port {metrics:?}"
        ));
    }
    problems
}

/// Selectors select their own pods, service accounts exist, RBAC bindings point at existing
/// roles and the autoscaler's account, and the roles grant what leader election and the status
/// ConfigMap need.
fn check_identity(b: &Base) -> Vec<String> {
    let mut problems = Vec::new();
    for d in b.of_kind("Deployment") {
        let sel = labels_at(&d.v, "/spec/selector/matchLabels");
        let labels = labels_at(&d.v, "/spec/template/metadata/labels");
        if !selects(&sel, &labels) {
            problems.push(format!(
                "{}: selector does not match its pod labels",
                d.id()
            ));
        }
        let sa = str_at(&d.v, "/spec/template/spec/serviceAccountName").unwrap_or("default");
        if b.find("ServiceAccount", sa).is_none() {
            problems.push(format!("{}: ServiceAccount {sa} does not exist", d.id()));
        }
    }
    if let (Ok(svc), Ok(a)) = (b.provider_service(), b.autoscaler())
        && selects(&labels_at(&svc.v, "/spec/selector"), &a.pod_labels())
    {
        problems.push(format!(
            "Service {} also selects the autoscaler",
            svc.name()
        ));
    }
    let Ok(a) = b.autoscaler() else {
        return problems;
    };
    let sa = str_at(a.pod, "/serviceAccountName").unwrap_or("default");
    let mut bound = BTreeSet::new();
    for binding in b
        .of_kind("ClusterRoleBinding")
        .chain(b.of_kind("RoleBinding"))
    {
        let kind = str_at(&binding.v, "/roleRef/kind").unwrap_or("");
        let name = str_at(&binding.v, "/roleRef/name").unwrap_or("");
        if b.find(kind, name).is_none() {
            problems.push(format!(
                "{}: roleRef {kind} {name} does not exist",
                binding.id()
            ));
        }
        for s in arr_at(&binding.v, "/subjects") {
            if str_at(s, "/kind") == Some("ServiceAccount") && str_at(s, "/name") == Some(sa) {
                match str_at(s, "/namespace") {
                    None => {}
                    Some(ns) if ns == b.namespace => {}
                    Some(ns) => problems.push(format!(
                        "{}: subject {sa} in namespace {ns}, the base deploys to {}",
                        binding.id(),
                        b.namespace
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
    let grants = |kind: &str, resource: &str, resource_name: Option<&str>, verb: &str| {
        b.of_kind(kind).any(|r| {
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

/// Resources carry no namespace of their own: the kustomization's applies to all.
fn check_namespace_agnostic(b: &Base) -> Vec<String> {
    b.docs
        .iter()
        .filter(|d| d.v.pointer("/metadata/namespace").is_some())
        .map(|d| {
            format!(
                "{} sets metadata.namespace; leave it to the kustomization",
                d.id()
            )
        })
        .collect()
}

/// The CloudStack cloud-config Secret the provider mounts is the one CKS creates (the example
/// describes it): same name, same key.
fn check_cloudstack_secret(b: &Base) -> Vec<String> {
    let p = match b.provider() {
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
            let example = b
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

// ---------------------------------------------------------------------------------------------
// Overlays, Dockerfile

/// Overlays: their resources exist, JSON6902 patches aim at objects and paths that exist in the
/// base (and `--nodes` replaces `--nodes`), `images` entries name images the base uses.
fn check_overlays(b: &Base) -> Vec<String> {
    let mut problems = Vec::new();
    let overlays = kustomize_dir().join("overlays");
    let Ok(entries) = fs::read_dir(&overlays) else {
        return vec![format!("{}: missing", overlays.display())];
    };
    let base_images: BTreeSet<String> = b
        .of_kind("Deployment")
        .flat_map(|d| arr_at(&d.v, "/spec/template/spec/containers").to_vec())
        .filter_map(|c| str_at(&c, "/image").map(|i| image_name(i).to_string()))
        .collect();
    for entry in entries {
        let dir = entry.expect("overlay entry").path();
        problems.extend(check_kustomization_files(&dir));
        let Ok(k) = load_yaml(&dir.join("kustomization.yaml")) else {
            continue;
        };
        let k = k.into_iter().next().unwrap_or(Value::Null);
        for c in strings_at(&k, "/components") {
            let path = dir.join(&c).join("kustomization.yaml");
            let kind = load_yaml(&path)
                .ok()
                .and_then(|d| d.into_iter().next())
                .and_then(|d| str_at(&d, "/kind").map(str::to_string));
            if kind.as_deref() != Some("Component") {
                problems.push(format!(
                    "{}: component {c} is not a kustomize Component",
                    dir.display()
                ));
            }
        }
        for i in arr_at(&k, "/images") {
            let name = str_at(i, "/name").unwrap_or("");
            if !base_images.contains(name) {
                problems.push(format!(
                    "{}: images entry {name} matches no container",
                    dir.display()
                ));
            }
        }
        for patch in arr_at(&k, "/patches") {
            let kind = str_at(patch, "/target/kind").unwrap_or("");
            let name = str_at(patch, "/target/name").unwrap_or("");
            let Some(target) = b.find(kind, name) else {
                problems.push(format!(
                    "{}: patch target {kind} {name} is not in the base",
                    dir.display()
                ));
                continue;
            };
            let Some(file) = str_at(patch, "/path") else {
                continue;
            };
            let Ok(docs) = load_yaml(&dir.join(file)) else {
                continue;
            };
            for op in docs
                .iter()
                .flat_map(|d| d.as_array().cloned().unwrap_or_default())
            {
                let path = str_at(&op, "/path").unwrap_or("");
                let verb = str_at(&op, "/op").unwrap_or("");
                if matches!(verb, "replace" | "remove" | "test") {
                    match target.v.pointer(path) {
                        None => problems.push(format!(
                            "{}/{file}: {verb} {path}: no such field in {}",
                            dir.display(),
                            target.id()
                        )),
                        Some(old) => {
                            let new = str_at(&op, "/value").unwrap_or("");
                            let old = old.as_str().unwrap_or("");
                            if let Some((flag_name, _)) = new.split_once('=')
                                && new.starts_with("--")
                                && !old.starts_with(&format!("{flag_name}="))
                            {
                                problems.push(format!(
                                    "{}/{file}: replaces {old:?} at {path} with {new:?}",
                                    dir.display()
                                ));
                            }
                        }
                    }
                }
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

/// A multi-stage build with `cargo build --release --locked`, a pinned static base, the binary
/// where the Deployment expects it, the user the pod runs as, and the ports the flags use.
fn check_dockerfile(b: &Base, dockerfile: &str, dockerignore: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let ins = dockerfile_instructions(dockerfile);
    let mut args = BTreeMap::new();
    let mut froms = Vec::new();
    for (op, rest) in &ins {
        match op.as_str() {
            "ARG" => {
                if let Some((k, v)) = rest.split_once('=') {
                    args.insert(k.to_string(), v.to_string());
                }
            }
            "FROM" => {
                let words: Vec<&str> = rest
                    .split_whitespace()
                    .filter(|w| !w.starts_with("--"))
                    .collect();
                let mut image = words.first().copied().unwrap_or("").to_string();
                for (k, v) in &args {
                    image = image.replace(&format!("${{{k}}}"), v);
                }
                froms.push(image);
            }
            _ => {}
        }
    }
    if froms.len() < 2 {
        problems.push("Dockerfile is not multi-stage".into());
    }
    for image in &froms {
        if image.contains('$')
            || !(image.contains("@sha256:") || image_tag(image).is_some_and(|t| t != "latest"))
        {
            problems.push(format!("Dockerfile FROM {image} is not pinned to a tag"));
        }
    }
    let final_base = froms.last().cloned().unwrap_or_default();
    if !(final_base.starts_with("gcr.io/distroless/static") || final_base == "scratch") {
        problems.push(format!(
            "final stage {final_base} is not a static (distroless/scratch) base"
        ));
    }
    let runs: Vec<&String> = ins
        .iter()
        .filter(|(op, _)| op == "RUN")
        .map(|(_, r)| r)
        .collect();
    if !runs
        .iter()
        .any(|r| r.contains("cargo build") && r.contains("--release") && r.contains("--locked"))
    {
        problems.push("Dockerfile does not run cargo build --release --locked".into());
    }
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
    match uid {
        None | Some(0) => problems.push(format!(
            "final stage USER {user:?} is not a numeric non-root uid"
        )),
        Some(uid) => {
            if let Ok(p) = b.provider() {
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
        }
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
    if let Ok(p) = b.provider() {
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
    for needed in ["src", "Cargo.toml", "Cargo.lock", "build.rs", "proto"] {
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
// Helm chart

fn chart_templates() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for entry in fs::read_dir(chart_dir().join("templates")).expect("chart templates") {
        let path = entry.expect("template entry").path();
        let name = path
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or("")
            .to_string();
        out.insert(name, fs::read_to_string(&path).expect("template readable"));
    }
    out
}

fn chart_values() -> Value {
    load_yaml(&chart_dir().join("values.yaml"))
        .expect("values.yaml parses")
        .into_iter()
        .next()
        .expect("values.yaml has a document")
}

/// `.Values.a.b.c` references in the templates, with the file they are in.
fn values_references(templates: &BTreeMap<String, String>) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for (file, text) in templates {
        let mut rest = text.as_str();
        while let Some(i) = rest.find(".Values.") {
            rest = &rest[i + ".Values.".len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
                .unwrap_or(rest.len());
            let path: Vec<String> = rest[..end]
                .trim_end_matches('.')
                .split('.')
                .map(str::to_string)
                .collect();
            out.push((file.clone(), path));
            rest = &rest[end..];
        }
    }
    out
}

/// Template references to values that values.yaml does not define, and includes of templates
/// that no `define` provides, and unbalanced `{{ }}` blocks.
fn check_chart_templates(templates: &BTreeMap<String, String>, values: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    for (file, path) in values_references(templates) {
        let mut node = values;
        for (depth, key) in path.iter().enumerate() {
            match node.get(key) {
                Some(next) => node = next,
                None => {
                    problems.push(format!(
                        "{file}: .Values.{} is not in values.yaml (no `{key}` under `{}`)",
                        path.join("."),
                        if depth == 0 {
                            ".".to_string()
                        } else {
                            path[..depth].join(".")
                        }
                    ));
                    break;
                }
            }
        }
    }
    let mut defined = BTreeSet::new();
    for text in templates.values() {
        for part in text.split("define \"").skip(1) {
            if let Some(name) = part.split('"').next() {
                defined.insert(name.to_string());
            }
        }
    }
    for (file, text) in templates {
        for word in ["include \"", "template \""] {
            for part in text.split(word).skip(1) {
                let name = part.split('"').next().unwrap_or("");
                if !defined.contains(name) {
                    problems.push(format!("{file}: {word}{name}\" is defined nowhere"));
                }
            }
        }
        // Block actions must balance, or Helm refuses the whole chart.
        let mut depth = 0i32;
        let mut rest = text.as_str();
        while let Some(start) = rest.find("{{") {
            let Some(len) = rest[start..].find("}}") else {
                problems.push(format!("{file}: unclosed {{{{"));
                break;
            };
            let action = rest[start + 2..start + len]
                .trim_start_matches('-')
                .trim()
                .trim_end_matches('-')
                .trim();
            let first = action.split_whitespace().next().unwrap_or("");
            match first {
                "if" | "range" | "with" | "define" | "block" => depth += 1,
                "end" => depth -= 1,
                _ => {}
            }
            if depth < 0 {
                problems.push(format!("{file}: `end` without a block"));
                depth = 0;
            }
            rest = &rest[start + len + 2..];
        }
        if depth != 0 {
            problems.push(format!("{file}: {depth} block(s) without `end`"));
        }
    }
    problems
}

/// The chart's defaults describe the same deployment as the kustomize base.
fn check_chart_matches_base(values: &Value, b: &Base) -> Vec<String> {
    let mut problems = Vec::new();
    let (p, a) = match (b.provider(), b.autoscaler()) {
        (Ok(p), Ok(a)) => (p, a),
        (Err(e), _) | (_, Err(e)) => return vec![e],
    };
    let args = p.args();
    let mut expect = |what: &str, chart: Option<String>, base: Option<String>| {
        if chart.is_none() || chart != base {
            problems.push(format!(
                "chart {what} is {chart:?}, the kustomize base has {base:?}"
            ));
        }
    };
    let num = |v: &Value, ptr: &str| v.pointer(ptr).map(scalar);
    expect(
        "service.grpcPort",
        num(values, "/service/grpcPort"),
        flag(&args, "listen")
            .and_then(|l| port_of(&l))
            .map(|p| p.to_string()),
    );
    expect(
        "service.metricsPort",
        num(values, "/service/metricsPort"),
        flag(&args, "metrics-listen")
            .and_then(|l| port_of(&l))
            .map(|p| p.to_string()),
    );
    let cloud =
        flag(&args, "cloud-config").and_then(|path| resolve_path(p.pod, p.container, &path).ok());
    let (secret, key) = match cloud {
        Some(FileSource::Secret { name, key }) => (Some(name), Some(key)),
        _ => (None, None),
    };
    expect(
        "cloudConfig.secretName",
        num(values, "/cloudConfig/secretName"),
        secret,
    );
    expect("cloudConfig.key", num(values, "/cloudConfig/key"), key);
    expect(
        "image.repository",
        num(values, "/image/repository"),
        str_at(p.container, "/image").map(|i| image_name(i).to_string()),
    );
    // The base runs the release the chart lists for that release's minor.
    let ca_image = effective_image(b, str_at(a.container, "/image").unwrap_or(""));
    let base_minor = image_tag(&ca_image).and_then(release_minor);
    let chart_tag = base_minor.as_ref().and_then(|minor| {
        values
            .pointer("/autoscaler/image/tagByKubernetesMinor")
            .and_then(|m| m.get(minor.as_str()))
            .map(scalar)
    });
    expect(
        "autoscaler.image (for the base's Kubernetes minor)",
        Some(format!(
            "{}:{}",
            num(values, "/autoscaler/image/repository").unwrap_or_default(),
            chart_tag.unwrap_or_default()
        )),
        Some(ca_image),
    );
    expect(
        "autoscaler.maxNodeProvisionTime",
        num(values, "/autoscaler/maxNodeProvisionTime"),
        flag(&a.args(), "max-node-provision-time"),
    );
    expect(
        "autoscaler.grpcTimeout",
        num(values, "/autoscaler/grpcTimeout"),
        b.autoscaler_cloud_config()
            .ok()
            .and_then(|cc| cc.pointer("/grpc_timeout").map(scalar)),
    );
    expect(
        "podSecurityContext.runAsUser",
        num(values, "/podSecurityContext/runAsUser"),
        p.pod.pointer("/securityContext/runAsUser").map(scalar),
    );
    for (ptr, want) in [
        ("/securityContext/readOnlyRootFilesystem", Value::Bool(true)),
        (
            "/securityContext/allowPrivilegeEscalation",
            Value::Bool(false),
        ),
        (
            "/autoscaler/securityContext/readOnlyRootFilesystem",
            Value::Bool(true),
        ),
        ("/podSecurityContext/runAsNonRoot", Value::Bool(true)),
        (
            "/autoscaler/podSecurityContext/runAsNonRoot",
            Value::Bool(true),
        ),
        ("/tls/enabled", Value::Bool(true)),
    ] {
        if values.pointer(ptr) != Some(&want) {
            problems.push(format!("chart default {ptr} is not {want}"));
        }
    }
    problems
}

// ---------------------------------------------------------------------------------------------
// The autoscaler: its release per Kubernetes minor, its flags, its RBAC in the chart

const AUTOSCALER_IMAGE: &str = "registry.k8s.io/autoscaling/cluster-autoscaler";

/// The Kubernetes minor of a cluster-autoscaler release tag: `v1.33.6` → `1.33`.
fn release_minor(tag: &str) -> Option<String> {
    let mut parts = tag.strip_prefix('v')?.split('.');
    let (major, minor, patch) = (parts.next()?, parts.next()?, parts.next()?);
    let numeric = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    (numeric(major) && numeric(minor) && numeric(patch) && parts.next().is_none())
        .then(|| format!("{major}.{minor}"))
}

/// `deploy/kustomize/components/cluster-autoscaler-<minor>`: minor → the tag it sets.
fn load_components() -> Result<BTreeMap<String, String>, Vec<String>> {
    let dir = kustomize_dir().join("components");
    let entries = fs::read_dir(&dir).map_err(|e| vec![format!("{}: {e}", dir.display())])?;
    let mut out = BTreeMap::new();
    let mut problems = Vec::new();
    for entry in entries {
        let path = entry.expect("component entry").path();
        let name = path
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or("")
            .to_string();
        let Some(minor) = name.strip_prefix("cluster-autoscaler-") else {
            problems.push(format!("component {name}: not cluster-autoscaler-<minor>"));
            continue;
        };
        let k = match load_yaml(&path.join("kustomization.yaml")) {
            Ok(docs) => docs.into_iter().next().unwrap_or(Value::Null),
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        if str_at(&k, "/kind") != Some("Component") {
            problems.push(format!("component {name}: kind is not Component"));
        }
        let images = arr_at(&k, "/images");
        match images {
            [i] if str_at(i, "/name") == Some(AUTOSCALER_IMAGE) => match str_at(i, "/newTag") {
                Some(tag) => {
                    out.insert(minor.to_string(), tag.to_string());
                }
                None => problems.push(format!("component {name}: no newTag")),
            },
            _ => problems.push(format!(
                "component {name}: expected one images entry for {AUTOSCALER_IMAGE}"
            )),
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// One release per Kubernetes minor, the same in the chart and the kustomize components, each
/// a release of its own minor, every minor from 1.28 up without a gap.
fn check_autoscaler_releases(values: &Value, components: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    let chart: BTreeMap<String, String> = values
        .pointer("/autoscaler/image/tagByKubernetesMinor")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| (k.clone(), scalar(v))).collect())
        .unwrap_or_default();
    if chart != *components {
        problems.push(format!(
            "chart autoscaler.image.tagByKubernetesMinor {chart:?} differs from the kustomize components {components:?}"
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
    let minor_number = |m: &str| m.strip_prefix("1.").and_then(|n| n.parse::<u32>().ok());
    let minors: Vec<u32> = chart.keys().filter_map(|m| minor_number(m)).collect();
    if minors.len() != chart.len() {
        problems.push(format!("minors {:?} are not all 1.<n>", chart.keys()));
    }
    let (lowest, highest) = (minors.iter().min().copied(), minors.iter().max().copied());
    if lowest != Some(28) {
        problems.push(format!("the oldest minor listed is {lowest:?}, not 1.28"));
    }
    if let (Some(lo), Some(hi)) = (lowest, highest)
        && minors.len() as u32 != hi - lo + 1
    {
        problems.push(format!("minors {minors:?} have a gap"));
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

/// The autoscaler's flags in the base and the chart: a max node provision time fit for CKS
/// scale jobs (`RECOMMENDED_MAX_NODE_PROVISION`), passed by the chart's template.
fn check_autoscaler_flags(b: &Base, templates: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    let a = match b.autoscaler() {
        Ok(a) => a,
        Err(e) => return vec![e],
    };
    let want = cks_autoscaler_provider::options::RECOMMENDED_MAX_NODE_PROVISION;
    match flag(&a.args(), "max-node-provision-time") {
        None => problems.push(
            "autoscaler: no --max-node-provision-time (the 15m default deletes CKS nodes still joining)"
                .into(),
        ),
        Some(v) => match go_duration_ms(&v) {
            Some(ms) if u128::from(ms) == want.as_millis() => {}
            other => problems.push(format!(
                "autoscaler --max-node-provision-time={v} ({other:?} ms), expected {want:?}"
            )),
        },
    }
    let deployment = templates
        .get("autoscaler-deployment.yaml")
        .map(String::as_str)
        .unwrap_or("");
    if !deployment
        .contains("printf \"--max-node-provision-time=%v\" .Values.autoscaler.maxNodeProvisionTime")
    {
        problems.push(
            "chart autoscaler-deployment.yaml does not pass --max-node-provision-time".into(),
        );
    }
    if !deployment.contains("include \"cks-autoscaler-provider.autoscalerImage\"") {
        problems
            .push("chart autoscaler-deployment.yaml does not choose the image per minor".into());
    }
    problems
}

/// The rules of the chart's ClusterRole and Role, read from its template with the template
/// actions left out (its rules are plain YAML).
fn chart_rbac_rules(template: &str) -> BTreeMap<String, Value> {
    let plain: String = template
        .lines()
        .filter(|l| !l.contains("{{"))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut out = BTreeMap::new();
    for doc in parse_yaml(&plain).expect("chart RBAC parses without its template actions") {
        if let Some(kind) = str_at(&doc, "/kind")
            && matches!(kind, "ClusterRole" | "Role")
        {
            out.insert(
                kind.to_string(),
                doc.pointer("/rules").cloned().unwrap_or(Value::Null),
            );
        }
    }
    out
}

/// The chart grants the autoscaler what the kustomize base grants it, rule for rule.
fn check_chart_rbac_matches_base(template: &str, b: &Base) -> Vec<String> {
    let chart = chart_rbac_rules(template);
    let mut problems = Vec::new();
    for kind in ["ClusterRole", "Role"] {
        let base = b
            .of_kind(kind)
            .next()
            .and_then(|d| d.v.pointer("/rules").cloned());
        if chart.get(kind) != base.as_ref() {
            problems.push(format!(
                "chart {kind} rules differ from the base's: {:?} vs {base:?}",
                chart.get(kind)
            ));
        }
    }
    problems
}

// ---------------------------------------------------------------------------------------------
// Tests on the real files

fn assert_none(what: &str, problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "{what}:\n  - {}",
        problems.join("\n  - ")
    );
}

#[test]
fn every_yaml_document_under_deploy_kustomize_parses() {
    let files = yaml_files_under(&kustomize_dir());
    assert!(
        files.len() >= 10,
        "expected the base, an overlay and examples, found {files:?}"
    );
    let mut problems = Vec::new();
    let mut documents = 0;
    for f in &files {
        match load_yaml(f) {
            Ok(docs) => documents += docs.len(),
            Err(e) => problems.push(e),
        }
    }
    assert_none("YAML that does not parse", problems);
    assert!(documents >= 20, "only {documents} documents parsed");
}

#[test]
fn kustomization_resources_exist_and_cover_the_directory() {
    assert_none(
        "kustomize base files",
        check_kustomization_files(&base_dir()),
    );
}

#[test]
fn ports_agree_between_flags_containers_service_probes_and_address() {
    assert_none("ports", check_ports(&load_base()));
}

#[test]
fn provider_flag_paths_are_mounted_from_existing_secret_keys() {
    assert_none("provider mounts", check_provider_mounts(&load_base()));
}

#[test]
fn provider_reads_the_cloudstack_secret_cks_creates() {
    assert_none(
        "CloudStack cloud-config",
        check_cloudstack_secret(&load_base()),
    );
}

#[test]
fn autoscaler_cloud_config_matches_its_client_certificate_and_the_service() {
    assert_none("autoscaler wiring", check_autoscaler_wiring(&load_base()));
}

#[test]
fn server_certificate_covers_the_address_and_shares_the_client_ca() {
    assert_none("TLS", check_tls(&load_base()));
}

#[test]
fn pods_are_non_root_read_only_and_confined() {
    assert_none("security", check_security(&load_base()));
}

#[test]
fn images_are_pinned_and_the_provider_runs_the_crate_version() {
    assert_none("images", check_images(&load_base()));
}

#[test]
fn network_policy_admits_only_the_autoscaler_and_prometheus() {
    assert_none("NetworkPolicy", check_network_policy(&load_base()));
}

#[test]
fn selectors_service_accounts_and_rbac_line_up() {
    assert_none("identity", check_identity(&load_base()));
}

#[test]
fn base_resources_leave_the_namespace_to_the_kustomization() {
    let b = load_base();
    assert_eq!(b.namespace, "kube-system");
    assert_none("namespaces", check_namespace_agnostic(&b));
}

#[test]
fn overlays_patch_what_the_base_has() {
    assert_none("overlays", check_overlays(&load_base()));
}

#[test]
fn dockerfile_builds_the_binary_the_deployment_runs() {
    let dockerfile = fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    let dockerignore = fs::read_to_string(repo().join(".dockerignore")).expect(".dockerignore");
    assert_none(
        "Dockerfile",
        check_dockerfile(&load_base(), &dockerfile, &dockerignore),
    );
}

#[test]
fn chart_metadata_parses_and_follows_the_crate_version() {
    let chart = load_yaml(&chart_dir().join("Chart.yaml"))
        .expect("Chart.yaml parses")
        .into_iter()
        .next()
        .expect("Chart.yaml has a document");
    assert_eq!(str_at(&chart, "/apiVersion"), Some("v2"));
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
    assert!(chart_values().is_object());
}

#[test]
fn chart_templates_reference_only_defined_values_and_helpers() {
    let templates = chart_templates();
    for expected in [
        "deployment.yaml",
        "service.yaml",
        "certificates.yaml",
        "networkpolicy.yaml",
        "autoscaler-deployment.yaml",
        "autoscaler-cloud-config.yaml",
        "autoscaler-rbac.yaml",
        "_helpers.tpl",
    ] {
        assert!(
            templates.contains_key(expected),
            "chart lacks templates/{expected}"
        );
    }
    assert!(values_references(&templates).len() > 40);
    assert_none(
        "chart templates",
        check_chart_templates(&templates, &chart_values()),
    );
}

#[test]
fn chart_defaults_match_the_kustomize_base() {
    assert_none(
        "chart vs base",
        check_chart_matches_base(&chart_values(), &load_base()),
    );
}

#[test]
fn each_kubernetes_minor_gets_its_autoscaler_release_in_the_chart_and_kustomize() {
    let components = load_components().unwrap_or_else(|p| panic!("components: {p:?}"));
    assert!(components.len() >= 9, "{components:?}");
    assert_none(
        "autoscaler releases",
        check_autoscaler_releases(&chart_values(), &components),
    );
}

#[test]
fn the_autoscaler_waits_long_enough_for_cks_nodes() {
    assert_none(
        "autoscaler flags",
        check_autoscaler_flags(&load_base(), &chart_templates()),
    );
}

#[test]
fn chart_rbac_grants_what_the_base_grants() {
    let templates = chart_templates();
    let rbac = templates.get("autoscaler-rbac.yaml").expect("chart RBAC");
    let rules = chart_rbac_rules(rbac);
    assert_eq!(rules.len(), 2, "{rules:?}");
    assert_none(
        "chart RBAC",
        check_chart_rbac_matches_base(rbac, &load_base()),
    );
}

// ---------------------------------------------------------------------------------------------
// Broken wiring is caught: each test breaks one thing in memory.

fn edit(b: &mut Base, kind: &str, name: &str, pointer: &str, value: Value) {
    let doc = b
        .docs
        .iter_mut()
        .find(|d| d.kind() == kind && d.name() == name)
        .unwrap_or_else(|| panic!("{kind} {name} in the base"));
    *doc.v
        .pointer_mut(pointer)
        .unwrap_or_else(|| panic!("{pointer} in {kind} {name}")) = value;
}

fn edit_cloud_config(b: &mut Base, from: &str, to: &str) {
    let doc = b
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

fn provider_arg_index(b: &Base, prefix: &str) -> usize {
    b.provider()
        .expect("provider")
        .args()
        .iter()
        .position(|a| a.starts_with(prefix))
        .unwrap_or_else(|| panic!("provider arg {prefix}"))
}

fn assert_caught(problems: Vec<String>, needle: &str) {
    assert!(
        problems.iter().any(|p| p.contains(needle)),
        "expected a problem mentioning {needle:?}, got {problems:?}"
    );
}

#[test]
fn a_service_port_that_differs_from_the_address_is_caught() {
    let mut b = load_base();
    edit(
        &mut b,
        "Service",
        "cks-autoscaler-provider",
        "/spec/ports/0/port",
        Value::from(8087),
    );
    assert_caught(check_ports(&b), "autoscaler address");
}

#[test]
fn a_container_port_that_differs_from_the_listen_flag_is_caught() {
    let mut b = load_base();
    let i = provider_arg_index(&b, "--listen=");
    edit(
        &mut b,
        "Deployment",
        "cks-autoscaler-provider",
        &format!("/spec/template/spec/containers/0/args/{i}"),
        Value::from("--listen=0.0.0.0:9999"),
    );
    let problems = check_ports(&b);
    assert_caught(problems.clone(), "container port `grpc`");
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
    let mut b = load_base();
    edit(
        &mut b,
        "Deployment",
        "cks-autoscaler-provider",
        "/spec/template/spec/containers/0/readinessProbe/httpGet/port",
        Value::from("grpc"),
    );
    assert_caught(check_ports(&b), "readinessProbe probes port");
}

#[test]
fn a_tls_path_outside_the_mount_is_caught() {
    let mut b = load_base();
    let i = provider_arg_index(&b, "--tls-cert=");
    edit(
        &mut b,
        "Deployment",
        "cks-autoscaler-provider",
        &format!("/spec/template/spec/containers/0/args/{i}"),
        Value::from("--tls-cert=/certs/tls.crt"),
    );
    assert_caught(check_provider_mounts(&b), "--tls-cert");
}

#[test]
fn a_misspelt_secret_name_is_caught() {
    let mut b = load_base();
    edit(
        &mut b,
        "Deployment",
        "cks-autoscaler-provider",
        "/spec/template/spec/volumes/0/secret/secretName",
        Value::from("cloudstack-secrets"),
    );
    assert_caught(check_provider_mounts(&b), "cloudstack-secrets");
    assert_caught(check_cloudstack_secret(&b), "cloudstack-secrets");
}

#[test]
fn a_wrong_client_key_path_in_the_autoscaler_cloud_config_is_caught() {
    let mut b = load_base();
    edit_cloud_config(&mut b, "/tls/ca.crt", "/client/ca.crt");
    assert_caught(check_autoscaler_wiring(&b), "`cacert`");
}

#[test]
fn an_address_the_server_certificate_does_not_cover_is_caught() {
    let mut b = load_base();
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
    let mut b = load_base();
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
fn a_writable_root_filesystem_is_caught() {
    let mut b = load_base();
    edit(
        &mut b,
        "Deployment",
        "cks-autoscaler-provider",
        "/spec/template/spec/containers/0/securityContext/readOnlyRootFilesystem",
        Value::Bool(false),
    );
    assert_caught(check_security(&b), "readOnlyRootFilesystem");
}

#[test]
fn an_unreadable_secret_mode_is_caught() {
    let mut b = load_base();
    edit(
        &mut b,
        "Deployment",
        "cks-cluster-autoscaler",
        "/spec/template/spec/volumes/1/secret/defaultMode",
        Value::from(0o400),
    );
    assert_caught(check_security(&b), "unreadable");
}

#[test]
fn a_latest_image_is_caught() {
    let mut b = load_base();
    edit(
        &mut b,
        "Deployment",
        "cks-cluster-autoscaler",
        "/spec/template/spec/containers/0/image",
        Value::from("registry.k8s.io/autoscaling/cluster-autoscaler:latest"),
    );
    b.kustomization["images"] = Value::Array(vec![]);
    assert_caught(check_images(&b), "not pinned");
}

#[test]
fn a_grpc_port_open_to_every_namespace_is_caught() {
    let mut b = load_base();
    edit(
        &mut b,
        "NetworkPolicy",
        "cks-autoscaler-provider",
        "/spec/ingress/0/from/0",
        serde_json::json!({ "namespaceSelector": {} }),
    );
    assert_caught(check_network_policy(&b), "besides the autoscaler");
}

#[test]
fn a_metrics_port_open_to_all_pods_is_caught() {
    let mut b = load_base();
    edit(
        &mut b,
        "NetworkPolicy",
        "cks-autoscaler-provider",
        "/spec/ingress/1/from/0",
        serde_json::json!({ "namespaceSelector": {}, "podSelector": {} }),
    );
    assert_caught(check_network_policy(&b), "metrics port is open to all pods");
}

#[test]
fn a_binding_to_a_missing_role_is_caught() {
    let mut b = load_base();
    edit(
        &mut b,
        "ClusterRoleBinding",
        "cks-cluster-autoscaler",
        "/roleRef/name",
        Value::from("cluster-autoscaler"),
    );
    assert_caught(check_identity(&b), "does not exist");
}

#[test]
fn an_overlay_patch_on_the_wrong_argument_is_caught() {
    let mut b = load_base();
    // Shift the provider's args so the example overlay's index no longer holds --nodes.
    let doc = b
        .docs
        .iter_mut()
        .find(|d| d.kind() == "Deployment" && d.name() == "cks-autoscaler-provider")
        .expect("provider");
    let args = doc.v["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array_mut()
        .expect("args");
    args.insert(1, Value::from("--log-format=text"));
    assert_caught(check_overlays(&b), "replaces");
}

#[test]
fn a_dockerfile_user_other_than_the_pod_user_is_caught() {
    let b = load_base();
    let dockerfile = fs::read_to_string(repo().join("Dockerfile"))
        .expect("Dockerfile")
        .replace("USER 65532:65532", "USER 1000:1000");
    assert_caught(
        check_dockerfile(&b, &dockerfile, "target\n.git\n"),
        "runs as",
    );
    let unpinned = fs::read_to_string(repo().join("Dockerfile"))
        .expect("Dockerfile")
        .replace("static-debian12:nonroot", "static-debian12");
    assert_caught(
        check_dockerfile(&b, &unpinned, "target\n.git\n"),
        "not pinned",
    );
}

#[test]
fn a_template_using_an_undefined_value_is_caught() {
    let mut templates = chart_templates();
    templates.insert(
        "broken.yaml".into(),
        "{{- if .Values.autoscaler.enabled }}\nport: {{ .Values.service.grcpPort }}\n{{- end }}\n{{ include \"cks-autoscaler-provider.nope\" . }}\n{{- if .Values.tls.enabled }}\n".into(),
    );
    let problems = check_chart_templates(&templates, &chart_values());
    assert_caught(problems.clone(), ".Values.service.grcpPort");
    assert_caught(problems.clone(), "cks-autoscaler-provider.nope");
    assert_caught(problems, "without `end`");
}

#[test]
fn a_chart_default_that_drifts_from_the_base_is_caught() {
    let mut values = chart_values();
    values["service"]["grpcPort"] = Value::from(50051);
    assert_caught(
        check_chart_matches_base(&values, &load_base()),
        "service.grpcPort",
    );
}

#[test]
fn a_missing_or_default_provision_time_is_caught() {
    let templates = chart_templates();
    let mut b = load_base();
    let i = b
        .autoscaler()
        .expect("autoscaler")
        .args()
        .iter()
        .position(|a| a.starts_with("--max-node-provision-time"))
        .expect("flag");
    edit(
        &mut b,
        "Deployment",
        "cks-cluster-autoscaler",
        &format!("/spec/template/spec/containers/0/args/{i}"),
        Value::from("--max-node-provision-time=15m"),
    );
    assert_caught(check_autoscaler_flags(&b, &templates), "expected 1500s");
    edit(
        &mut b,
        "Deployment",
        "cks-cluster-autoscaler",
        &format!("/spec/template/spec/containers/0/args/{i}"),
        Value::from("--v=2"),
    );
    assert_caught(
        check_autoscaler_flags(&b, &templates),
        "no --max-node-provision-time",
    );
    let mut values = chart_values();
    values["autoscaler"]["maxNodeProvisionTime"] = Value::from("15m");
    assert_caught(
        check_chart_matches_base(&values, &load_base()),
        "autoscaler.maxNodeProvisionTime",
    );
}

#[test]
fn a_release_of_the_wrong_minor_or_a_drift_between_chart_and_components_is_caught() {
    let components = load_components().expect("components");
    let mut values = chart_values();
    values["autoscaler"]["image"]["tagByKubernetesMinor"]["1.33"] = Value::from("v1.32.7");
    let problems = check_autoscaler_releases(&values, &components);
    assert_caught(problems.clone(), "a release of another minor");
    assert_caught(problems, "differs from the kustomize components");
    let mut fewer = components.clone();
    fewer.remove("1.30");
    let mut values = chart_values();
    if let Some(m) = values["autoscaler"]["image"]["tagByKubernetesMinor"].as_object_mut() {
        m.remove("1.30");
    }
    assert_caught(check_autoscaler_releases(&values, &fewer), "have a gap");
    let mut values = chart_values();
    values["autoscaler"]["image"]["tag"] = Value::from("v1.35.2");
    assert_caught(
        check_autoscaler_releases(&values, &components),
        "set by default",
    );
    assert_eq!(release_minor("v1.33.6").as_deref(), Some("1.33"));
    assert_eq!(release_minor("1.33.6"), None);
    assert_eq!(release_minor("v1.33"), None);
}

#[test]
fn rbac_without_volumeattachments_or_drifting_from_the_chart_is_caught() {
    let mut b = load_base();
    let rules = b
        .find("ClusterRole", "cks-cluster-autoscaler")
        .expect("ClusterRole")
        .v["rules"]
        .as_array()
        .expect("rules")
        .clone();
    let i = rules
        .iter()
        .position(|r| {
            strings_at(r, "/resources")
                .iter()
                .any(|x| x == "volumeattachments")
        })
        .expect("a rule for volumeattachments");
    let mut trimmed = rules[i].clone();
    trimmed["resources"] = Value::from(vec!["storageclasses", "csinodes"]);
    edit(
        &mut b,
        "ClusterRole",
        "cks-cluster-autoscaler",
        &format!("/rules/{i}"),
        trimmed,
    );
    assert_caught(check_identity(&b), "watch volumeattachments");
    let templates = chart_templates();
    let rbac = templates.get("autoscaler-rbac.yaml").expect("chart RBAC");
    assert_caught(
        check_chart_rbac_matches_base(rbac, &b),
        "ClusterRole rules differ",
    );
}

#[test]
fn go_durations_and_flags_parse_as_the_tools_do() {
    assert_eq!(go_duration_ms("10s"), Some(10_000));
    assert_eq!(go_duration_ms("1m30s"), Some(90_000));
    assert_eq!(go_duration_ms("500ms"), Some(500));
    assert_eq!(go_duration_ms("10"), None);
    let args: Vec<String> = ["serve", "--nodes=1:2:a", "--nodes", "3:4:b", "--insecure"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(flag_values(&args, "nodes"), vec!["1:2:a", "3:4:b"]);
    assert_eq!(flag(&args, "insecure").as_deref(), Some(""));
    // Kubernetes reads a leading-zero mode as octal.
    let v = parse_yaml("mode: 0440\n").expect("yaml");
    assert_eq!(v[0]["mode"].as_u64(), Some(0o440));
}
