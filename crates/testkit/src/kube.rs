//! A real Kubernetes API server for the tests that talk to one ([`KubeApiServer`]): etcd and
//! kube-apiserver, built from their Go modules by `tools/kube-testenv/build.sh`, started as
//! child processes on loopback in a temporary directory and killed when the value is dropped.
//!
//! The binaries and the CRDs come from [`crate::tools`]: `CKS_KUBE_BIN_DIR` and
//! `CKS_KUBE_CRD_DIR` when given (`.ci/run`), else built on first use by the scripts CI runs.
//! Without them a test fails naming what is missing; it is never skipped.
//!
//! The server is as a cluster's is where it matters to a client: HTTPS with a serving
//! certificate from a CA of the test's own ([`KubeApiServer::ca_pem`]), RBAC authorization, and
//! service-account tokens signed by a key generated here, so an identity bound to one Role gets
//! exactly that Role's permissions ([`KubeApiServer::service_account_token`]). The admin is a
//! static bearer token in `system:masters`. etcd listens on Unix sockets in the temporary
//! directory (no port to collide on); the API server on a free loopback port, started again on
//! another one if that port was taken in between. Nothing here waits a fixed time: every wait
//! polls a condition (the socket exists, `/readyz` answers 200) with a bound.

use crate::certs::{Ca, TempDir};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long etcd and the API server may take to come up (a few seconds on loopback; far more
/// on a loaded machine, which makes a test slower, never red).
const START_BOUND: Duration = Duration::from_secs(120);
/// How often a start-up condition is checked.
const POLL: Duration = Duration::from_millis(50);
/// Each request of the test kit's own client.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// etcd's client socket, relative to the temporary directory (etcd names a Unix socket
/// `host:port`; both processes run in that directory).
const ETCD_SOCKET: &str = "etcd-client:0";
const ETCD_PEER_SOCKET: &str = "etcd-peer:0";

/// Why the test environment could not start.
#[derive(Debug)]
pub struct KubeEnvError(String);

impl std::fmt::Display for KubeEnvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for KubeEnvError {}

fn fail<T>(what: impl Into<String>) -> Result<T, KubeEnvError> {
    Err(KubeEnvError(what.into()))
}

/// etcd and kube-apiserver running for one test. Both processes are killed when dropped.
pub struct KubeApiServer {
    dir: TempDir,
    bins: PathBuf,
    etcd: Child,
    apiserver: Option<Child>,
    port: u16,
    ca_pem: String,
    admin_token: String,
    http: reqwest::Client,
    /// Each start of the API server gets its own log file.
    starts: u32,
}

/// The directory of the CustomResourceDefinitions the rendered manifests use (what
/// `tools/kube-testenv/crds.sh` prints).
pub fn crd_dir() -> Result<PathBuf, KubeEnvError> {
    crate::tools::kube_crd_dir().map_err(|e| KubeEnvError(e.to_string()))
}

/// What the API server answered to [`KubeApiServer::send`].
#[derive(Debug)]
pub struct KubeAnswer {
    pub status: u16,
    /// The `Warning` headers (RFC 7234 form, `299 - "text"`), reduced to their text: what
    /// kubectl prints as `Warning: ...` (PodSecurity's "would violate" among them).
    pub warnings: Vec<String>,
    /// The JSON answer (`Value::Null` when it is not JSON).
    pub body: Value,
}

/// The text of one `Warning` header value (`299 - "text"`), unquoted.
fn warning_text(header: &str) -> String {
    let quoted = header
        .split_once(" - ")
        .map_or(header, |(_, rest)| rest)
        .trim();
    quoted
        .strip_prefix('"')
        .and_then(|q| q.strip_suffix('"'))
        .map_or_else(|| quoted.to_string(), |q| q.replace("\\\"", "\""))
}

/// A token nobody guesses within a test's life: the process, the time and a counter.
fn new_token(what: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{what}-{}-{nanos:x}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

impl KubeApiServer {
    /// Starts etcd and kube-apiserver and returns once `/readyz` answers 200; an error when
    /// the binaries cannot be had ([`crate::tools::kube_bin_dir`]) or do not come up.
    pub async fn start() -> Result<KubeApiServer, KubeEnvError> {
        // A first set-up builds for minutes: off the runtime's threads.
        let bins = tokio::task::spawn_blocking(crate::tools::kube_bin_dir)
            .await
            .map_err(|e| KubeEnvError(format!("setting up etcd and kube-apiserver: {e}")))?
            .map_err(|e| KubeEnvError(e.to_string()))?;
        let dir = TempDir::new("kube");
        let ca = Ca::new("cks kube-testenv CA");
        let serving = ca.server();
        dir.write("serving.pem", &serving.cert);
        dir.write("serving-key.pem", &serving.key);
        // The service-account signing key (ECDSA P-256, PKCS#8) and its public half, which the
        // API server verifies tokens with.
        let sa_key = rcgen::KeyPair::generate()
            .map_err(|e| KubeEnvError(format!("service-account key: {e}")))?;
        dir.write("sa-key.pem", sa_key.serialize_pem());
        dir.write("sa-pub.pem", sa_key.public_key_pem());
        let admin_token = new_token("admin");
        dir.write(
            "tokens.csv",
            format!("{admin_token},cks-test-admin,cks-test-admin,\"system:masters\"\n"),
        );
        let etcd = start_etcd(&bins, &dir).await?;
        let http = reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(ca.pem.as_bytes())
                .map_err(|e| KubeEnvError(format!("the test CA: {e}")))?])
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| KubeEnvError(format!("HTTP client: {e}")))?;
        let mut server = KubeApiServer {
            dir,
            bins,
            etcd,
            apiserver: None,
            port: 0,
            ca_pem: ca.pem,
            admin_token,
            http,
            starts: 0,
        };
        server.start_apiserver(None).await?;
        Ok(server)
    }

    /// The API server's base URL (`https://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The CA (PEM) the serving certificate chains to.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A bearer token of `system:masters`.
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// Writes the CA into the temporary directory and returns its path (for a client that
    /// reads a CA file, as in a pod).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.write("ca.pem", &self.ca_pem)
    }

    /// A path in the server's temporary directory, removed with it.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path(file)
    }

    /// Starts kube-apiserver, on `port` or a free one, and waits for `/readyz`.
    async fn start_apiserver(&mut self, port: Option<u16>) -> Result<(), KubeEnvError> {
        let mut last = String::new();
        for _attempt in 0..3 {
            let port = port.unwrap_or_else(crate::process::free_port);
            self.starts += 1;
            let log = self
                .dir
                .path(&format!("kube-apiserver-{}.log", self.starts));
            let file = std::fs::File::create(&log)
                .map_err(|e| KubeEnvError(format!("{}: {e}", log.display())))?;
            let p = |f: &str| self.dir.path(f).display().to_string();
            let mut child = Command::new(self.bins.join("kube-apiserver"))
                .current_dir(self.dir.path(""))
                .args([
                    format!("--etcd-servers=unix://{ETCD_SOCKET}"),
                    "--bind-address=127.0.0.1".into(),
                    "--advertise-address=127.0.0.1".into(),
                    format!("--secure-port={port}"),
                    format!("--tls-cert-file={}", p("serving.pem")),
                    format!("--tls-private-key-file={}", p("serving-key.pem")),
                    format!("--token-auth-file={}", p("tokens.csv")),
                    "--authorization-mode=RBAC".into(),
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                    format!("--service-account-key-file={}", p("sa-pub.pem")),
                    format!("--service-account-signing-key-file={}", p("sa-key.pem")),
                    "--service-cluster-ip-range=10.0.0.0/24".into(),
                    "--enable-priority-and-fairness=false".into(),
                    "--profiling=false".into(),
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(file)
                .spawn()
                .map_err(|e| KubeEnvError(format!("starting kube-apiserver: {e}")))?;
            self.port = port;
            match self.wait_ready(&mut child, &log).await {
                Ok(()) => {
                    self.apiserver = Some(child);
                    return Ok(());
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    last = e.0;
                    // Only a port taken in between is worth another try.
                    if !last.contains("address already in use") {
                        break;
                    }
                }
            }
        }
        fail(last)
    }

    /// Polls `/readyz` until it answers 200; an error when the process exits or the bound
    /// passes, with the end of its log.
    async fn wait_ready(&self, child: &mut Child, log: &Path) -> Result<(), KubeEnvError> {
        let started = Instant::now();
        let url = format!("{}/readyz", self.url());
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return fail(format!(
                    "kube-apiserver exited ({status}) before it was ready; its log ends:\n{}",
                    log_tail(log)
                ));
            }
            let last = match self
                .http
                .get(&url)
                .bearer_auth(&self.admin_token)
                .timeout(Duration::from_secs(5))
                .send()
                .await
            {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) => format!("HTTP {}", r.status()),
                Err(e) => e.to_string(),
            };
            if started.elapsed() > START_BOUND {
                return fail(format!(
                    "kube-apiserver not ready after {START_BOUND:?} (last: {last}); its log ends:\n{}",
                    log_tail(log)
                ));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Kills the API server (etcd keeps the data): requests now fail to connect.
    pub fn stop_apiserver(&mut self) {
        if let Some(mut c) = self.apiserver.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the API server again on the same port, over the same etcd; returns once ready.
    pub async fn restart_apiserver(&mut self) -> Result<(), KubeEnvError> {
        self.stop_apiserver();
        let port = self.port;
        self.start_apiserver(Some(port)).await
    }

    /// One request as the admin: `method` on `path` (below the base URL) with a JSON body.
    /// Returns the status code and the JSON answer (`Value::Null` when it is not JSON).
    pub async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), KubeEnvError> {
        self.request_as(&self.admin_token, method, path, body).await
    }

    /// [`KubeApiServer::request`] with another bearer token.
    pub async fn request_as(
        &self,
        token: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), KubeEnvError> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.url()))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| KubeEnvError(format!("{method} {path}: {e}")))?;
        let status = resp.status().as_u16();
        let text = resp
            .text()
            .await
            .map_err(|e| KubeEnvError(format!("{method} {path}: {e}")))?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    /// One request as the admin with a body of `content_type` (e.g.
    /// `application/apply-patch+yaml` for a server-side apply), keeping the `Warning` headers.
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        content_type: &str,
        body: String,
    ) -> Result<KubeAnswer, KubeEnvError> {
        let resp = self
            .http
            .request(method.clone(), format!("{}{path}", self.url()))
            .bearer_auth(&self.admin_token)
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body)
            .send()
            .await
            .map_err(|e| KubeEnvError(format!("{method} {path}: {e}")))?;
        let status = resp.status().as_u16();
        let warnings = resp
            .headers()
            .get_all(reqwest::header::WARNING)
            .iter()
            .map(|v| warning_text(&String::from_utf8_lossy(v.as_bytes())))
            .collect();
        let text = resp
            .text()
            .await
            .map_err(|e| KubeEnvError(format!("{method} {path}: {e}")))?;
        Ok(KubeAnswer {
            status,
            warnings,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
        })
    }

    /// Creates an object (POST to `collection`) as the admin; one that already exists is
    /// left as it is.
    pub async fn create(&self, collection: &str, object: &Value) -> Result<(), KubeEnvError> {
        match self
            .request(reqwest::Method::POST, collection, Some(object))
            .await?
        {
            (200..=299 | 409, _) => Ok(()),
            (code, answer) => fail(format!("POST {collection}: HTTP {code}: {answer}")),
        }
    }

    /// Creates the namespace `ns` (if absent).
    pub async fn create_namespace(&self, ns: &str) -> Result<(), KubeEnvError> {
        self.create(
            "/api/v1/namespaces",
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await
    }

    /// An identity with exactly the permissions of `role` (a `rbac.authorization.k8s.io/v1`
    /// Role, created in `ns` as given): the namespace, the ServiceAccount `account`, the Role
    /// and a RoleBinding of the one to the other are created, and a token of the account
    /// (TokenRequest, one hour) returned, as the kubelet would mount it in a pod.
    pub async fn service_account_token(
        &self,
        ns: &str,
        account: &str,
        role: &Value,
    ) -> Result<String, KubeEnvError> {
        self.create_namespace(ns).await?;
        self.create(
            &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}}),
        )
        .await?;
        let Some(role_name) = role["metadata"]["name"].as_str() else {
            return fail(format!("the Role has no metadata.name: {role}"));
        };
        let rbac = format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}");
        let mut role = role.clone();
        role["metadata"]["namespace"] = json!(ns);
        self.create(&format!("{rbac}/roles"), &role).await?;
        self.create(
            &format!("{rbac}/rolebindings"),
            &json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": format!("{account}-{role_name}")},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name},
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
            }),
        )
        .await?;
        let path = format!("/api/v1/namespaces/{ns}/serviceaccounts/{account}/token");
        let (code, answer) = self
            .request(
                reqwest::Method::POST,
                &path,
                Some(&json!({
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenRequest",
                    "spec": {"expirationSeconds": 3600},
                })),
            )
            .await?;
        match answer["status"]["token"].as_str() {
            Some(t) if (200..300).contains(&code) => Ok(t.to_string()),
            _ => fail(format!("POST {path}: HTTP {code}: {answer}")),
        }
    }
}

impl KubeApiServer {
    /// Grants the ServiceAccount `account` of `ns` (made by
    /// [`KubeApiServer::service_account_token`]) the cluster-wide permissions of
    /// `cluster_role` (a `rbac.authorization.k8s.io/v1` ClusterRole, created as given) through
    /// a ClusterRoleBinding.
    pub async fn bind_cluster_role(
        &self,
        ns: &str,
        account: &str,
        cluster_role: &Value,
    ) -> Result<(), KubeEnvError> {
        let Some(name) = cluster_role["metadata"]["name"].as_str() else {
            return fail(format!(
                "the ClusterRole has no metadata.name: {cluster_role}"
            ));
        };
        let rbac = "/apis/rbac.authorization.k8s.io/v1";
        self.create(&format!("{rbac}/clusterroles"), cluster_role)
            .await?;
        self.create(
            &format!("{rbac}/clusterrolebindings"),
            &json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": format!("{ns}-{account}-{name}")},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
            }),
        )
        .await
    }
}

/// Starts etcd on Unix sockets in `dir` and waits for its client socket.
async fn start_etcd(bins: &Path, dir: &TempDir) -> Result<Child, KubeEnvError> {
    let log = dir.path("etcd.log");
    let file =
        std::fs::File::create(&log).map_err(|e| KubeEnvError(format!("{}: {e}", log.display())))?;
    let client = format!("unix://{ETCD_SOCKET}");
    let peer = format!("unix://{ETCD_PEER_SOCKET}");
    let mut child = Command::new(bins.join("etcd"))
        .current_dir(dir.path(""))
        .args([
            "--name=default".to_string(),
            format!("--data-dir={}", dir.path("etcd-data").display()),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster=default={peer}"),
            "--log-level=warn".into(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .map_err(|e| KubeEnvError(format!("starting etcd: {e}")))?;
    let socket = dir.path(ETCD_SOCKET);
    let started = Instant::now();
    while !socket.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            return fail(format!(
                "etcd exited ({status}); its log ends:\n{}",
                log_tail(&log)
            ));
        }
        if started.elapsed() > START_BOUND {
            let _ = child.kill();
            let _ = child.wait();
            return fail(format!(
                "etcd not listening after {START_BOUND:?}; its log ends:\n{}",
                log_tail(&log)
            ));
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(child)
}

impl Drop for KubeApiServer {
    fn drop(&mut self) {
        self.stop_apiserver();
        let _ = self.etcd.kill();
        let _ = self.etcd.wait();
    }
}
