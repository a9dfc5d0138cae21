//! The provider's one conversation with the Kubernetes API: reading, creating and replacing one
//! ConfigMap (where `provider::store` records the promises, `--state-configmap`), reading the
//! cluster's Nodes (`--confirm-node-marks`), reading and writing one Lease (leader election,
//! [`crate::leader`]), and asking the API server what the provider's own identity may do.
//! Owns the connection ([`KubeConfig`]: the in-cluster service account, or an explicit URL, CA
//! and token) and the mapping of the API server's answers to [`KubeError`]; knows nothing of
//! what the ConfigMap or the Lease mean.
//!
//! A thin client over `reqwest` (already the CloudStack client's transport, with the same
//! rustls and aws-lc-rs) rather than `kube` and `k8s-openapi`: three calls on one object do not
//! pay for a second HTTP stack and every Kubernetes type compiled twice in CI (ARCHITECTURE.md,
//! "The durable store").
//!
//! The token is read from its file before every request: the kubelet rotates projected
//! service-account tokens (hourly by default) and the file is the only place the new one shows.

use cks_domain::lease::LeaseRecord;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Where the kubelet mounts a pod's service account: `token`, `ca.crt` and `namespace`.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The environment variable naming another directory holding `token`, `ca.crt` and
/// `namespace`, for a provider run outside a pod (with `KUBERNETES_SERVICE_HOST` and
/// `KUBERNETES_SERVICE_PORT` naming the API server).
pub const SERVICE_ACCOUNT_DIR_ENV: &str = "CKS_PROVIDER_SERVICE_ACCOUNT_DIR";

/// [`SERVICE_ACCOUNT_DIR`], or the directory [`SERVICE_ACCOUNT_DIR_ENV`] names.
fn service_account_dir() -> PathBuf {
    std::env::var_os(SERVICE_ACCOUNT_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from(SERVICE_ACCOUNT_DIR), PathBuf::from)
}

/// How long one request may take, connection included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The bearer token of every request.
#[derive(Clone)]
pub enum Token {
    /// Read from this file before each request (a projected service-account token rotates).
    File(PathBuf),
    /// Given once (tests, or a token that does not rotate).
    Fixed(String),
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Token::File(p) => write!(f, "File({})", p.display()),
            Token::Fixed(_) => f.write_str("Fixed(<redacted>)"),
        }
    }
}

/// How to reach the API server.
#[derive(Debug, Clone)]
pub struct KubeConfig {
    /// The API server's base URL, `https://HOST:PORT`.
    pub url: String,
    /// The CA (PEM) its serving certificate chains to; the only one trusted.
    pub ca_pem: Vec<u8>,
    pub token: Token,
}

impl KubeConfig {
    /// The pod's own service account: `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`,
    /// `ca.crt` and `token` under [`SERVICE_ACCOUNT_DIR`] (or [`SERVICE_ACCOUNT_DIR_ENV`]).
    pub fn in_cluster() -> Result<KubeConfig, KubeError> {
        let env = |k: &str| {
            std::env::var(k).ok().filter(|v| !v.is_empty()).ok_or_else(|| {
                KubeError::Config(format!(
                    "{k} is not set: the Kubernetes API is reached from inside a pod (in-cluster config)"
                ))
            })
        };
        let host = env("KUBERNETES_SERVICE_HOST")?;
        let port = env("KUBERNETES_SERVICE_PORT")?;
        // An IPv6 service address goes in brackets.
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host
        };
        let dir = service_account_dir();
        let ca_path = dir.join("ca.crt");
        let ca_pem = std::fs::read(&ca_path).map_err(|e| {
            KubeError::Config(format!(
                "reading the service account's CA {}: {e} (is automountServiceAccountToken off?)",
                ca_path.display()
            ))
        })?;
        Ok(KubeConfig {
            url: format!("https://{host}:{port}"),
            ca_pem,
            token: Token::File(dir.join("token")),
        })
    }
}

/// The ConfigMap of `--state-configmap`: where it is and how to reach the API server.
#[derive(Debug, Clone)]
pub struct ConfigMapRef {
    pub namespace: String,
    pub name: String,
    pub api: KubeConfig,
}

impl ConfigMapRef {
    /// From the flags, in a pod: the in-cluster config, and `namespace`, or the pod's own
    /// when `None`.
    pub fn in_cluster(name: &str, namespace: Option<&str>) -> Result<ConfigMapRef, KubeError> {
        check_name("--state-configmap", name)?;
        let namespace = match namespace {
            Some(ns) => {
                check_name("--state-namespace", ns)?;
                ns.to_string()
            }
            None => in_cluster_namespace()?,
        };
        Ok(ConfigMapRef {
            namespace,
            name: name.to_string(),
            api: KubeConfig::in_cluster()?,
        })
    }
}

/// The namespace of the pod's service account (`namespace` under [`SERVICE_ACCOUNT_DIR`]).
pub fn in_cluster_namespace() -> Result<String, KubeError> {
    let path = service_account_dir().join("namespace");
    let ns = std::fs::read_to_string(&path).map_err(|e| {
        KubeError::Config(format!(
            "reading the pod's namespace from {}: {e}; give --state-namespace",
            path.display()
        ))
    })?;
    let ns = ns.trim();
    check_name("namespace", ns)?;
    Ok(ns.to_string())
}

/// Checks that `name` can name a ConfigMap or a namespace (a DNS-1123 subdomain; namespaces
/// are labels, which are subdomains without dots: the API server says so if not).
pub fn check_name(what: &str, name: &str) -> Result<(), KubeError> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name
            .split('.')
            .all(|part| !part.is_empty() && !part.starts_with('-') && !part.ends_with('-'));
    if ok {
        Ok(())
    } else {
        Err(KubeError::Config(format!(
            "{what} {name:?} is not a Kubernetes name (lower-case letters, digits, '-' and '.', starting and ending with a letter or digit)"
        )))
    }
}

/// A ConfigMap as read or written: its version and its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigMap {
    pub resource_version: String,
    pub data: BTreeMap<String, String>,
}

/// What a call to the API server ended in.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The connection settings are unusable.
    #[error("{0}")]
    Config(String),
    /// The token file could not be read.
    #[error("reading the service-account token {path}: {detail}")]
    Token { path: String, detail: String },
    /// No answer: connection refused, timeout, TLS.
    #[error("{verb} {what}: no answer from the Kubernetes API: {detail}")]
    Transport {
        verb: &'static str,
        what: String,
        detail: String,
    },
    /// The API server answered with an error status.
    #[error("{verb} {what}: the Kubernetes API answered {code} {reason}: {message}")]
    Status {
        verb: &'static str,
        what: String,
        code: u16,
        reason: String,
        message: String,
    },
}

impl KubeError {
    fn code(&self) -> Option<u16> {
        match self {
            KubeError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// 409: the object changed since it was read (update), or exists already (create).
    pub fn is_conflict(&self) -> bool {
        self.code() == Some(409)
    }

    /// 404.
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }

    /// 401 or 403: the identity is unknown or may not do this.
    pub fn is_refused(&self) -> bool {
        matches!(self.code(), Some(401 | 403))
    }
}

/// The cluster-autoscaler's mark on a node it is removing (`taints.ToBeDeletedTaint`,
/// `utils/taints/taints.go`).
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// What the provider reads of a Node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeFacts {
    /// It carries [`TO_BE_DELETED_TAINT`].
    pub marked: bool,
    /// CloudStack counts it Ready: the STATUS column of `kubectl get nodes` is exactly `Ready`
    /// (CKS's scale-up and Alert reconciliation match `$2=="Ready"`), which kubectl prints for
    /// a Ready condition `True` on a Node not marked unschedulable; a cordoned one shows
    /// `Ready,SchedulingDisabled` (`printNode`, `pkg/printers/internalversion/printers.go`).
    pub counted_ready: bool,
}

impl NodeFacts {
    fn of(node: &Value) -> NodeFacts {
        let marked = node["spec"]["taints"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["key"] == TO_BE_DELETED_TAINT));
        let ready = node["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        let cordoned = node["spec"]["unschedulable"].as_bool() == Some(true);
        NodeFacts {
            marked,
            counted_ready: ready && !cordoned,
        }
    }
}

/// A Kubernetes `Status` answer, as much of it as an error needs.
#[derive(Deserialize, Default)]
struct Status {
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: String,
}

/// The client: one HTTP connection pool to one API server.
#[derive(Clone)]
pub struct KubeClient {
    http: reqwest::Client,
    url: String,
    token: Token,
}

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClient")
            .field("url", &self.url)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

fn configmaps(ns: &str) -> String {
    format!("/api/v1/namespaces/{ns}/configmaps")
}

fn shown(ns: &str, name: &str) -> String {
    format!("configmap {ns}/{name}")
}

impl KubeClient {
    /// A client of the API server `config` names, trusting only its CA.
    pub fn new(config: &KubeConfig) -> Result<KubeClient, KubeError> {
        let url = config.url.trim_end_matches('/').to_string();
        if !url.starts_with("https://") {
            return Err(KubeError::Config(format!(
                "the Kubernetes API URL {url:?} is not https://"
            )));
        }
        let certs = reqwest::Certificate::from_pem_bundle(&config.ca_pem)
            .map_err(|e| KubeError::Config(format!("the Kubernetes API's CA is not PEM: {e}")))?;
        if certs.is_empty() {
            return Err(KubeError::Config(
                "the Kubernetes API's CA holds no PEM certificate".into(),
            ));
        }
        let http = reqwest::Client::builder()
            .tls_certs_only(certs)
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(REQUEST_TIMEOUT)
            .user_agent(concat!(
                "cks-autoscaler-provider/",
                env!("CARGO_PKG_VERSION")
            ))
            .build()
            .map_err(|e| KubeError::Config(format!("HTTP client: {e}")))?;
        Ok(KubeClient {
            http,
            url,
            token: config.token.clone(),
        })
    }

    fn token(&self) -> Result<String, KubeError> {
        match &self.token {
            Token::Fixed(t) => Ok(t.clone()),
            Token::File(path) => std::fs::read_to_string(path)
                .map(|t| t.trim().to_string())
                .map_err(|e| KubeError::Token {
                    path: path.display().to_string(),
                    detail: e.to_string(),
                }),
        }
    }

    /// One request; the answer's JSON on success, the error named by `verb` and `what`.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        verb: &'static str,
        what: &str,
    ) -> Result<Value, KubeError> {
        let method_is_patch = method == reqwest::Method::PATCH;
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(self.token()?)
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(b) = body {
            req = if method_is_patch {
                // A JSON merge patch (RFC 7386): the keys given replace, the rest stays.
                req.header(
                    reqwest::header::CONTENT_TYPE,
                    "application/merge-patch+json",
                )
                .body(b.to_string())
            } else {
                req.json(b)
            };
        }
        let transport = |e: reqwest::Error| KubeError::Transport {
            verb,
            what: what.to_string(),
            detail: error_chain(&e.without_url()),
        };
        let resp = req.send().await.map_err(transport)?;
        let code = resp.status();
        let bytes = resp.bytes().await.map_err(transport)?;
        if code.is_success() {
            return serde_json::from_slice(&bytes).map_err(|e| KubeError::Transport {
                verb,
                what: what.to_string(),
                detail: format!("the answer is not JSON: {e}"),
            });
        }
        let status: Status = serde_json::from_slice(&bytes).unwrap_or_default();
        Err(KubeError::Status {
            verb,
            what: what.to_string(),
            code: code.as_u16(),
            reason: if status.reason.is_empty() {
                code.canonical_reason().unwrap_or("").to_string()
            } else {
                status.reason
            },
            message: status.message.chars().take(500).collect(),
        })
    }

    /// What the provider reads of Node `name`; `None` when there is no such Node.
    pub async fn node(&self, name: &str) -> Result<Option<NodeFacts>, KubeError> {
        check_name("node", name)?;
        let what = format!("node {name}");
        match self
            .call(
                reqwest::Method::GET,
                &format!("/api/v1/nodes/{name}"),
                None,
                "get",
                &what,
            )
            .await
        {
            Ok(v) => Ok(Some(NodeFacts::of(&v))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// GET the ConfigMap; `None` when it does not exist.
    pub async fn get_configmap(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Option<ConfigMap>, KubeError> {
        let path = format!("{}/{name}", configmaps(ns));
        match self
            .call(reqwest::Method::GET, &path, None, "get", &shown(ns, name))
            .await
        {
            Ok(v) => Ok(Some(parse_configmap(&v))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// POST a new ConfigMap holding `data`; a conflict when it exists already.
    pub async fn create_configmap(
        &self,
        ns: &str,
        name: &str,
        data: &BTreeMap<String, String>,
    ) -> Result<ConfigMap, KubeError> {
        let body = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns, "labels": labels()},
            "data": data,
        });
        let v = self
            .call(
                reqwest::Method::POST,
                &configmaps(ns),
                Some(&body),
                "create",
                &shown(ns, name),
            )
            .await?;
        Ok(parse_configmap(&v))
    }

    /// PUT the ConfigMap with `data`, only if it is still at `resource_version` (optimistic
    /// concurrency: a conflict when anyone wrote it since).
    pub async fn replace_configmap(
        &self,
        ns: &str,
        name: &str,
        resource_version: &str,
        data: &BTreeMap<String, String>,
    ) -> Result<ConfigMap, KubeError> {
        let body = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": ns,
                "resourceVersion": resource_version,
                "labels": labels(),
            },
            "data": data,
        });
        let path = format!("{}/{name}", configmaps(ns));
        let v = self
            .call(
                reqwest::Method::PUT,
                &path,
                Some(&body),
                "update",
                &shown(ns, name),
            )
            .await?;
        Ok(parse_configmap(&v))
    }

    /// Whether this client's identity may `verb` the ConfigMap `name` (`create`: any ConfigMap
    /// of `ns`, since RBAC cannot restrict a create to a name), asked through a
    /// SelfSubjectAccessReview, which changes nothing.
    pub async fn may(&self, verb: &str, ns: &str, name: &str) -> Result<bool, KubeError> {
        let mut attributes = json!({"namespace": ns, "verb": verb, "resource": "configmaps"});
        if verb != "create" {
            attributes["name"] = json!(name);
        }
        let body = json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        });
        let v = self
            .call(
                reqwest::Method::POST,
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                Some(&body),
                "create",
                "selfsubjectaccessreview",
            )
            .await?;
        Ok(v["status"]["allowed"].as_bool() == Some(true))
    }
}

impl KubeClient {
    /// GET the Lease: its `resourceVersion` and spec; `None` when it does not exist.
    pub async fn get_lease(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Option<(String, LeaseRecord)>, KubeError> {
        let path = format!("{}/{name}", leases(ns));
        match self
            .call(
                reqwest::Method::GET,
                &path,
                None,
                "get",
                &lease_shown(ns, name),
            )
            .await
        {
            Ok(v) => Ok(Some(parse_lease(&v))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// POST the Lease holding `record` (a conflict when it exists), or PUT it at
    /// `resource_version` (a conflict when anyone wrote it since). Returns the new version.
    pub async fn write_lease(
        &self,
        ns: &str,
        name: &str,
        resource_version: Option<&str>,
        record: &LeaseRecord,
    ) -> Result<String, KubeError> {
        let mut metadata = json!({"name": name, "namespace": ns, "labels": lease_labels()});
        if let Some(v) = resource_version {
            metadata["resourceVersion"] = json!(v);
        }
        let body = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": record.holder,
                "leaseDurationSeconds": record.duration_secs,
                "acquireTime": record.acquire_time,
                "renewTime": record.renew_time,
                "leaseTransitions": record.transitions,
            },
        });
        let (method, path, verb) = match resource_version {
            None => (reqwest::Method::POST, leases(ns), "create"),
            Some(_) => (
                reqwest::Method::PUT,
                format!("{}/{name}", leases(ns)),
                "update",
            ),
        };
        let v = self
            .call(method, &path, Some(&body), verb, &lease_shown(ns, name))
            .await?;
        Ok(parse_lease(&v).0)
    }
}

impl KubeClient {
    /// Sets label `key` of Pod `ns/name` to `value` (a merge patch: other labels stay).
    pub async fn label_pod(
        &self,
        ns: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<(), KubeError> {
        check_name("pod", name)?;
        check_name("namespace", ns)?;
        let body = json!({"metadata": {"labels": {key: value}}});
        self.call(
            reqwest::Method::PATCH,
            &format!("/api/v1/namespaces/{ns}/pods/{name}"),
            Some(&body),
            "patch",
            &format!("pod {ns}/{name}"),
        )
        .await
        .map(|_| ())
    }
}

fn leases(ns: &str) -> String {
    format!("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases")
}

fn lease_shown(ns: &str, name: &str) -> String {
    format!("lease {ns}/{name}")
}

fn lease_labels() -> Value {
    json!({"app.kubernetes.io/name": "cks-autoscaler-provider", "app.kubernetes.io/component": "leader-election"})
}

/// A Lease's version and spec. Absent fields read as empty (a Lease another tool created
/// may leave any of them out); times are kept as written.
fn parse_lease(v: &Value) -> (String, LeaseRecord) {
    let spec = &v["spec"];
    let text = |k: &str| spec[k].as_str().unwrap_or_default().to_string();
    let count = |k: &str| {
        spec[k]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0)
    };
    (
        v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        LeaseRecord {
            holder: text("holderIdentity"),
            duration_secs: count("leaseDurationSeconds"),
            acquire_time: text("acquireTime"),
            renew_time: text("renewTime"),
            transitions: count("leaseTransitions"),
        },
    )
}

/// The labels of the ConfigMap the provider creates.
fn labels() -> Value {
    json!({"app.kubernetes.io/name": "cks-autoscaler-provider", "app.kubernetes.io/component": "state"})
}

fn parse_configmap(v: &Value) -> ConfigMap {
    let data = v["data"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default();
    ConfigMap {
        resource_version: v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        data,
    }
}

/// An error and its sources on one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CloudStack counts a node Ready only when `kubectl get nodes` prints exactly `Ready`.
    #[test]
    fn a_node_is_counted_ready_only_ready_and_schedulable() {
        let node = |ready: Option<&str>, unschedulable: Option<bool>, taint: Option<&str>| {
            let mut n = json!({"spec": {}, "status": {"conditions": [
                {"type": "MemoryPressure", "status": "False"}
            ]}});
            if let Some(r) = ready {
                n["status"]["conditions"]
                    .as_array_mut()
                    .expect("conditions")
                    .push(json!({"type": "Ready", "status": r}));
            }
            if let Some(u) = unschedulable {
                n["spec"]["unschedulable"] = json!(u);
            }
            if let Some(t) = taint {
                n["spec"]["taints"] = json!([{"key": t, "effect": "NoSchedule"}]);
            }
            NodeFacts::of(&n)
        };
        let table = [
            (node(Some("True"), None, None), true, false),
            (node(Some("True"), Some(false), None), true, false),
            (node(Some("True"), Some(true), None), false, false),
            (node(Some("False"), None, None), false, false),
            (node(Some("Unknown"), None, None), false, false),
            (node(None, None, None), false, false),
            (
                node(Some("True"), None, Some(TO_BE_DELETED_TAINT)),
                true,
                true,
            ),
            (
                node(
                    Some("True"),
                    None,
                    Some("DeletionCandidateOfClusterAutoscaler"),
                ),
                true,
                false,
            ),
        ];
        for (i, (facts, counted_ready, marked)) in table.into_iter().enumerate() {
            assert_eq!(facts.counted_ready, counted_ready, "row {i}");
            assert_eq!(facts.marked, marked, "row {i}");
        }
    }

    #[test]
    fn names_are_checked_as_kubernetes_checks_them() {
        for ok in ["cks-state", "a", "a.b-c", "0x"] {
            assert!(check_name("name", ok).is_ok(), "{ok}");
        }
        for bad in ["", "A", "-a", "a-", "a..b", "a_b", &"a".repeat(254)] {
            let e = check_name("--state-configmap", bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains("--state-configmap"), "{e}");
        }
    }

    #[test]
    fn a_fixed_token_never_shows_in_debug() {
        let c = KubeConfig {
            url: "https://127.0.0.1:6443".into(),
            ca_pem: Vec::new(),
            token: Token::Fixed("secret-token".into()),
        };
        assert!(!format!("{c:?}").contains("secret-token"));
    }

    #[test]
    fn a_client_needs_https_and_a_ca() {
        let mut c = KubeConfig {
            url: "http://127.0.0.1:6443".into(),
            ca_pem: b"not pem".to_vec(),
            token: Token::Fixed("t".into()),
        };
        assert!(
            KubeClient::new(&c)
                .unwrap_err()
                .to_string()
                .contains("https")
        );
        c.url = "https://127.0.0.1:6443".into();
        assert!(KubeClient::new(&c).unwrap_err().to_string().contains("CA"));
    }
}
