//! The CloudStack API client: request signing, envelopes, async jobs, error mapping,
//! timeouts. The only code in the provider that talks HTTP to CloudStack.
//!
//! Secrets (the API key's secret, signatures) never appear in logs, errors or `Debug` output.

pub mod error;
pub mod sign;
pub mod types;

pub use error::CsError;
use types::{AsyncJob, Capabilities, KubernetesCluster, ServiceOffering, Zone};

use serde::Deserialize as _;
use serde::de::DeserializeOwned;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where and how to reach CloudStack.
#[derive(Clone)]
pub struct ClientConfig {
    /// e.g. `https://cloud.example.com/client/api`.
    pub api_url: String,
    pub api_key: String,
    pub secret_key: String,
    /// Skip TLS verification (only when the operator set `ssl-no-verify`).
    pub ssl_no_verify: bool,
    /// Extra PEM CA bundle to trust for CloudStack's certificate.
    pub ca_bundle_pem: Option<Vec<u8>>,
    /// `projectid` added to every list call when set.
    pub project_id: Option<String>,
    /// Whole-request timeout (connect + response).
    pub request_timeout: Duration,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("api_url", &self.api_url)
            .field("api_key", &sign::mask(&self.api_key))
            .field("secret_key", &"***")
            .field("ssl_no_verify", &self.ssl_no_verify)
            .field("project_id", &self.project_id)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

/// Page size for list commands that follow paging.
pub const DEFAULT_PAGE_SIZE: u32 = 500;

/// Upper bound on pages fetched for one list call, so a server that ignores `page` cannot keep
/// us looping.
const MAX_PAGES: u32 = 10_000;

/// Bodies larger than this are refused rather than buffered.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// How much of an unexpected body an error quotes.
const SNIPPET_CHARS: usize = 200;

/// Connect timeout cap; the whole-request timeout still applies when it is shorter.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A cheap-to-clone CloudStack client (one connection pool).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    page_size: u32,
}

struct Inner {
    http: reqwest::Client,
    api_url: String,
    api_key: String,
    secret_key: String,
    project_id: Option<String>,
    request_timeout: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("api_url", &self.inner.api_url)
            .field("api_key", &sign::mask(&self.inner.api_key))
            .field("project_id", &self.inner.project_id)
            .field("page_size", &self.page_size)
            .finish_non_exhaustive()
    }
}

/// Which list commands exist and what their arrays are called.
struct ListSpec {
    command: &'static str,
    /// Field holding the array inside the response object.
    field: &'static str,
}

const LIST_CLUSTERS: ListSpec = ListSpec {
    command: "listKubernetesClusters",
    field: "kubernetescluster",
};
const LIST_ASYNC_JOBS: ListSpec = ListSpec {
    command: "listAsyncJobs",
    field: "asyncjobs",
};
const LIST_SERVICE_OFFERINGS: ListSpec = ListSpec {
    command: "listServiceOfferings",
    field: "serviceoffering",
};
const LIST_ZONES: ListSpec = ListSpec {
    command: "listZones",
    field: "zone",
};
const SCALE_CLUSTER: &str = "scaleKubernetesCluster";
const QUERY_JOB: &str = "queryAsyncJobResult";
const LIST_CAPABILITIES: &str = "listCapabilities";

impl Client {
    /// Builds the client; fails on a bad URL or an unreadable CA bundle.
    pub fn new(config: ClientConfig) -> Result<Self, CsError> {
        let url = url::Url::parse(config.api_url.trim()).map_err(|e| {
            CsError::Config(format!(
                "api URL {:?} is not a valid URL: {e}",
                config.api_url
            ))
        })?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(CsError::Config(format!(
                "api URL {:?} must be an http:// or https:// URL with a host",
                config.api_url
            )));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(CsError::Config(format!(
                "api URL {:?} must not carry a query or fragment",
                config.api_url
            )));
        }
        if config.request_timeout.is_zero() {
            return Err(CsError::Config(
                "request timeout must be greater than zero".into(),
            ));
        }
        if config.api_key.is_empty() || config.secret_key.is_empty() {
            return Err(CsError::Config(
                "API key and secret key must not be empty".into(),
            ));
        }
        let mut builder = reqwest::Client::builder()
            .timeout(config.request_timeout)
            .connect_timeout(config.request_timeout.min(CONNECT_TIMEOUT))
            .pool_idle_timeout(Duration::from_secs(60))
            .user_agent(concat!(
                "cks-autoscaler-provider/",
                env!("CARGO_PKG_VERSION")
            ));
        if let Some(pem) = &config.ca_bundle_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| {
                CsError::Config(format!("CA bundle is not valid PEM: {}", e.without_url()))
            })?;
            if certs.is_empty() {
                return Err(CsError::Config(
                    "CA bundle holds no PEM certificates".into(),
                ));
            }
            builder = builder.tls_certs_merge(certs);
        }
        if config.ssl_no_verify {
            tracing::warn!(api_url = %config.api_url, "TLS certificate verification disabled (ssl-no-verify)");
            builder = builder.tls_danger_accept_invalid_certs(true);
        }
        let http = builder.build().map_err(|e| {
            CsError::Config(format!("HTTP client: {}", error_chain(&e.without_url())))
        })?;
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                api_url: url.to_string(),
                api_key: config.api_key,
                secret_key: config.secret_key,
                project_id: config.project_id.filter(|p| !p.is_empty()),
                request_timeout: config.request_timeout,
            }),
            page_size: DEFAULT_PAGE_SIZE,
        })
    }

    /// The same client (same pool) listing with `page_size` items per page (minimum 1).
    pub fn with_page_size(mut self, page_size: u32) -> Self {
        self.page_size = page_size.max(1);
        self
    }

    /// `listKubernetesClusters id=…`; `Ok(None)` when CloudStack lists none.
    pub async fn get_cluster(&self, id: &str) -> Result<Option<KubernetesCluster>, CsError> {
        let clusters: Vec<KubernetesCluster> = self
            .list_one_page(&LIST_CLUSTERS, vec![("id", id.to_string())])
            .await?;
        Ok(clusters.into_iter().find(|c| c.id == id))
    }

    /// `listKubernetesClusters name=…` (exact name).
    pub async fn find_clusters_by_name(
        &self,
        name: &str,
    ) -> Result<Vec<KubernetesCluster>, CsError> {
        let clusters: Vec<KubernetesCluster> = self
            .list_all_pages(&LIST_CLUSTERS, vec![("name", name.to_string())])
            .await?;
        // Documented as a substring match in some versions; keep exact matches only.
        Ok(clusters.into_iter().filter(|c| c.name == name).collect())
    }

    /// `listKubernetesClusters` (all the key can see; follows paging).
    pub async fn list_clusters(&self) -> Result<Vec<KubernetesCluster>, CsError> {
        self.list_all_pages(&LIST_CLUSTERS, Vec::new()).await
    }

    /// `scaleKubernetesCluster id=… size=…` and nothing else. Returns the job id.
    pub async fn scale_cluster_size(&self, cluster_id: &str, size: u32) -> Result<String, CsError> {
        let params = vec![("id", cluster_id.to_string()), ("size", size.to_string())];
        self.submit_async(SCALE_CLUSTER, params).await
    }

    /// `scaleKubernetesCluster id=… nodeids=a,b` and nothing else. Returns the job id.
    pub async fn scale_cluster_remove_nodes(
        &self,
        cluster_id: &str,
        vm_ids: &[String],
    ) -> Result<String, CsError> {
        if vm_ids.is_empty()
            || vm_ids
                .iter()
                .any(|id| id.trim().is_empty() || id.contains(','))
        {
            return Err(CsError::Config(format!(
                "{SCALE_CLUSTER} needs one or more node ids without commas, got {vm_ids:?}"
            )));
        }
        let params = vec![
            ("id", cluster_id.to_string()),
            ("nodeids", vm_ids.join(",")),
        ];
        self.submit_async(SCALE_CLUSTER, params).await
    }

    /// `queryAsyncJobResult jobid=…`.
    pub async fn query_job(&self, job_id: &str) -> Result<AsyncJob, CsError> {
        let body = self
            .call(QUERY_JOB, &[("jobid", job_id.to_string())])
            .await?;
        AsyncJob::deserialize(&body).map_err(|e| malformed(QUERY_JOB, format!("job {job_id}: {e}")))
    }

    /// `listAsyncJobs` (all pages): used after a restart to find scale jobs still running.
    pub async fn list_async_jobs(&self) -> Result<Vec<AsyncJob>, CsError> {
        self.list_all_pages(&LIST_ASYNC_JOBS, Vec::new()).await
    }

    /// One page of `listAsyncJobs startdate=… page=… pagesize=…`: the jobs created at or after
    /// `startdate` (CloudStack's `yyyy-MM-dd'T'HH:mm:ssZ`, see [`types::cloudstack_date`]),
    /// which CloudStack lists oldest first (by id). The flag says whether another page may
    /// follow. Read one page at a time so a long job history is never held in memory whole.
    pub async fn list_async_jobs_page(
        &self,
        startdate: &str,
        page: u32,
    ) -> Result<(Vec<types::ListedJob>, bool), CsError> {
        let params = vec![
            ("startdate", startdate.to_string()),
            ("page", page.max(1).to_string()),
            ("pagesize", self.page_size.to_string()),
        ];
        let jobs: Vec<types::ListedJob> = self.list_one_page(&LIST_ASYNC_JOBS, params).await?;
        let more = u32::try_from(jobs.len()).is_ok_and(|n| n >= self.page_size);
        Ok((jobs, more))
    }

    /// `listServiceOfferings id=…`; `Ok(None)` when none.
    pub async fn get_service_offering(&self, id: &str) -> Result<Option<ServiceOffering>, CsError> {
        let offerings: Vec<ServiceOffering> = self
            .list_one_page(&LIST_SERVICE_OFFERINGS, vec![("id", id.to_string())])
            .await?;
        Ok(offerings.into_iter().find(|o| o.id == id))
    }

    /// `listZones id=…`; `Ok(None)` when none.
    pub async fn get_zone(&self, id: &str) -> Result<Option<Zone>, CsError> {
        let zones: Vec<Zone> = self
            .list_one_page(&LIST_ZONES, vec![("id", id.to_string())])
            .await?;
        Ok(zones.into_iter().find(|z| z.id == id))
    }

    /// `listCapabilities`.
    pub async fn capabilities(&self) -> Result<Capabilities, CsError> {
        let body = self.call(LIST_CAPABILITIES, &[]).await?;
        let capability = body
            .get("capability")
            .ok_or_else(|| malformed(LIST_CAPABILITIES, "no \"capability\" object".into()))?;
        Capabilities::deserialize(capability)
            .map_err(|e| malformed(LIST_CAPABILITIES, e.to_string()))
    }

    /// Sends one signed GET for `command` with `params` (besides `command`, `response`, `apiKey`,
    /// `signature`, which are added) and returns the object inside `<command>response`.
    /// Error envelopes, HTTP failures and unreadable bodies come back as [`CsError`].
    pub async fn call(
        &self,
        command: &str,
        params: &[(&str, String)],
    ) -> Result<serde_json::Value, CsError> {
        let started = Instant::now();
        let result = self.call_inner(command, params).await;
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let outcome = match &result {
            Ok(_) => "ok",
            Err(CsError::Unreachable { .. }) => "unreachable",
            Err(CsError::Api { .. }) => "api_error",
            Err(CsError::Unauthorized { .. }) => "unauthorized",
            Err(CsError::Http { .. }) => "http_error",
            Err(CsError::Malformed { .. }) => "malformed",
            Err(CsError::Config(_)) => "config",
        };
        crate::metrics::record_cloudstack(command, started, outcome);
        match &result {
            Ok(_) => tracing::debug!(command, elapsed_ms, outcome = "ok", "CloudStack call"),
            Err(err) => {
                tracing::debug!(command, elapsed_ms, outcome = "error", error = %err, "CloudStack call")
            }
        }
        result
    }

    async fn call_inner(
        &self,
        command: &str,
        params: &[(&str, String)],
    ) -> Result<serde_json::Value, CsError> {
        let inner = &self.inner;
        let mut all: Vec<(String, String)> = Vec::with_capacity(params.len() + 2);
        all.push(("command".to_string(), command.to_string()));
        all.push(("response".to_string(), "json".to_string()));
        all.extend(params.iter().map(|(k, v)| ((*k).to_string(), v.clone())));
        let query = sign::signed_query(&all, &inner.api_key, &inner.secret_key);
        let url = format!("{}?{}", inner.api_url, query);

        let response = inner
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| self.transport_error(command, e))?;
        let status = response.status().as_u16();
        let body = self.read_body(command, response).await?;
        self.interpret(command, status, &body)
    }

    async fn read_body(
        &self,
        command: &str,
        mut response: reqwest::Response,
    ) -> Result<Vec<u8>, CsError> {
        let mut body = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > MAX_BODY_BYTES {
                        return Err(malformed(
                            command,
                            format!("response larger than {MAX_BODY_BYTES} bytes"),
                        ));
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => return Ok(body),
                Err(e) => return Err(self.transport_error(command, e)),
            }
        }
    }

    /// Maps a reqwest failure to `Unreachable`. The request URL carries the API key and the
    /// signature, so the error is stripped of it and the text is redacted again to be sure.
    fn transport_error(&self, command: &str, err: reqwest::Error) -> CsError {
        let is_timeout = err.is_timeout();
        let is_connect = err.is_connect();
        let chain = error_chain(&err.without_url());
        let detail = if is_timeout {
            format!(
                "no response within {:?} ({chain})",
                self.inner.request_timeout
            )
        } else if is_connect {
            format!("cannot connect to {}: {chain}", self.inner.api_url)
        } else {
            chain
        };
        CsError::Unreachable {
            command: command.to_string(),
            detail: self.redact(&detail),
        }
    }

    /// Turns status + body into the inner response object or the matching error.
    fn interpret(
        &self,
        command: &str,
        status: u16,
        body: &[u8],
    ) -> Result<serde_json::Value, CsError> {
        let text = String::from_utf8_lossy(body);
        let parsed: Result<serde_json::Value, _> = serde_json::from_slice(body);
        let success = (200..300).contains(&status);
        let json = match parsed {
            Ok(json) => json,
            Err(e) => {
                let snippet = self.snippet(&text);
                return Err(if status == 401 {
                    CsError::Unauthorized {
                        command: command.into(),
                        http_status: status,
                        detail: snippet,
                    }
                } else if !success {
                    CsError::Http {
                        command: command.into(),
                        http_status: status,
                        snippet,
                    }
                } else if looks_like_json(&text) {
                    malformed(command, format!("invalid JSON ({e})"))
                } else {
                    malformed(command, format!("expected JSON, got: {snippet}"))
                });
            }
        };
        let Some(inner) = envelope(&json, command) else {
            let snippet = self.snippet(&text);
            return Err(if status == 401 {
                CsError::Unauthorized {
                    command: command.into(),
                    http_status: status,
                    detail: snippet,
                }
            } else if !success {
                CsError::Http {
                    command: command.into(),
                    http_status: status,
                    snippet,
                }
            } else {
                malformed(
                    command,
                    format!(
                        "no \"{}response\" object in: {snippet}",
                        command.to_lowercase()
                    ),
                )
            });
        };
        if let Some(errorcode) = inner.get("errorcode") {
            let errorcode = errorcode
                .as_i64()
                .or_else(|| errorcode.as_str().and_then(|s| s.trim().parse().ok()))
                .unwrap_or(i64::from(status));
            let cserrorcode = inner
                .get("cserrorcode")
                .and_then(|c| {
                    c.as_i64()
                        .or_else(|| c.as_str().and_then(|s| s.trim().parse().ok()))
                })
                .unwrap_or(0);
            let errortext = inner
                .get("errortext")
                .and_then(|t| t.as_str())
                .map_or_else(|| "(no error text)".to_string(), |t| self.redact(t));
            if status == 401 || errorcode == 401 || is_auth_text(&errortext) {
                return Err(CsError::Unauthorized {
                    command: command.into(),
                    http_status: status,
                    detail: format!("{errortext} (errorcode {errorcode})"),
                });
            }
            return Err(CsError::Api {
                command: command.into(),
                http_status: status,
                errorcode,
                cserrorcode,
                errortext,
            });
        }
        if status == 401 {
            return Err(CsError::Unauthorized {
                command: command.into(),
                http_status: status,
                detail: self.snippet(&text),
            });
        }
        if !success {
            return Err(CsError::Http {
                command: command.into(),
                http_status: status,
                snippet: self.snippet(&text),
            });
        }
        Ok(inner.clone())
    }

    /// Submits an async command and returns its `jobid`.
    async fn submit_async(
        &self,
        command: &str,
        params: Vec<(&str, String)>,
    ) -> Result<String, CsError> {
        let body = self.call(command, &params).await?;
        match body.get("jobid") {
            Some(serde_json::Value::String(id)) if !id.is_empty() => Ok(id.clone()),
            _ => Err(malformed(command, "no \"jobid\" in the response".into())),
        }
    }

    /// List params plus `projectid` when configured.
    fn list_params<'a>(&self, mut params: Vec<(&'a str, String)>) -> Vec<(&'a str, String)> {
        if let Some(project) = &self.inner.project_id {
            params.push(("projectid", project.clone()));
        }
        params
    }

    async fn list_one_page<T: DeserializeOwned>(
        &self,
        spec: &ListSpec,
        params: Vec<(&str, String)>,
    ) -> Result<Vec<T>, CsError> {
        let params = self.list_params(params);
        let body = self.call(spec.command, &params).await?;
        Ok(parse_list(spec, &body)?.0)
    }

    async fn list_all_pages<T: DeserializeOwned>(
        &self,
        spec: &ListSpec,
        params: Vec<(&str, String)>,
    ) -> Result<Vec<T>, CsError> {
        let base = self.list_params(params);
        let page_size = self.page_size;
        let mut items = Vec::new();
        for page in 1..=MAX_PAGES {
            let mut params = base.clone();
            params.push(("page", page.to_string()));
            params.push(("pagesize", page_size.to_string()));
            let body = self.call(spec.command, &params).await?;
            let (mut batch, count) = parse_list::<T>(spec, &body)?;
            let got = batch.len();
            items.append(&mut batch);
            let page_full = u32::try_from(got).is_ok_and(|g| g >= page_size);
            let count_reached =
                count.is_some_and(|c| u64::try_from(items.len()).unwrap_or(u64::MAX) >= c);
            if !page_full || count_reached {
                return Ok(items);
            }
        }
        Err(malformed(
            spec.command,
            format!("paging did not end after {MAX_PAGES} pages"),
        ))
    }

    /// Removes the API key, secret and any signature from text bound for errors or logs.
    fn redact(&self, text: &str) -> String {
        let inner = &self.inner;
        let mut out = text.to_string();
        for secret in [inner.secret_key.as_str(), inner.api_key.as_str()] {
            if secret.len() >= 4 {
                out = out.replace(secret, "***");
                let encoded = sign::encode_value(secret);
                if encoded != secret {
                    out = out.replace(&encoded, "***");
                }
            }
        }
        redact_query_param(&out, "signature")
    }

    /// A short, single-line, redacted excerpt of an unexpected body. Redaction runs on the
    /// whole text first so truncation cannot leave part of a key behind.
    fn snippet(&self, text: &str) -> String {
        let redacted = self.redact(text);
        let collapsed = redacted.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut short: String = collapsed.chars().take(SNIPPET_CHARS).collect();
        if collapsed.chars().count() > SNIPPET_CHARS {
            short.push('…');
        }
        if short.is_empty() {
            short.push_str("(empty body)");
        }
        short
    }
}

/// The object under `<command lower>response`, or the only `…response` key (some error paths
/// answer with `errorresponse`).
fn envelope<'a>(json: &'a serde_json::Value, command: &str) -> Option<&'a serde_json::Value> {
    let obj = json.as_object()?;
    let key = format!("{}response", command.to_lowercase());
    if let Some(inner) = obj.get(&key) {
        return inner.is_object().then_some(inner);
    }
    let mut responses = obj
        .iter()
        .filter(|(k, v)| k.ends_with("response") && v.is_object());
    match (responses.next(), responses.next()) {
        (Some((_, inner)), None) => Some(inner),
        _ => None,
    }
}

/// The items and `count` of a list response; `{}` is an empty list.
fn parse_list<T: DeserializeOwned>(
    spec: &ListSpec,
    body: &serde_json::Value,
) -> Result<(Vec<T>, Option<u64>), CsError> {
    let count = body.get("count").and_then(|c| {
        c.as_u64()
            .or_else(|| c.as_str().and_then(|s| s.trim().parse().ok()))
    });
    let items = match body.get(spec.field) {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                T::deserialize(item)
                    .map_err(|e| malformed(spec.command, format!("{}[{i}]: {e}", spec.field)))
            })
            .collect::<Result<Vec<T>, CsError>>()?,
        Some(_) => {
            return Err(malformed(
                spec.command,
                format!("\"{}\" is not an array", spec.field),
            ));
        }
    };
    Ok((items, count))
}

fn malformed(command: &str, detail: String) -> CsError {
    CsError::Malformed {
        command: command.to_string(),
        detail,
    }
}

fn looks_like_json(text: &str) -> bool {
    matches!(text.trim_start().chars().next(), Some('{' | '['))
}

/// Error texts CloudStack uses when the key or signature is refused.
fn is_auth_text(text: &str) -> bool {
    let lower = text.to_lowercase();
    [
        "unable to verify user credentials",
        "request signature",
        "invalid api key",
        "api key",
        "apikey",
        "signature version",
        "expired request",
    ]
    .iter()
    .any(|needle| lower.contains(needle))
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Replaces the value of `name=` query parameters in `text` with `***`.
fn redact_query_param(text: &str, name: &str) -> String {
    let needle = format!("{name}=");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find(&needle) {
        out.push_str(&rest[..pos + needle.len()]);
        out.push_str("***");
        let after = &rest[pos + needle.len()..];
        let end = after
            .find(|c: char| c == '&' || c == '"' || c == '\'' || c == '<' || c.is_whitespace())
            .unwrap_or(after.len());
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests;
