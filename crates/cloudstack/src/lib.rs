//! The CloudStack API client: request signing, envelopes, async jobs, error mapping,
//! timeouts. The only code in the provider that talks HTTP to CloudStack.
//!
//! Secrets (the API key's secret, signatures) never appear in logs, errors or `Debug` output.

pub mod error;
pub mod redact;
pub mod sign;
pub mod types;

pub use error::CsError;
use types::{AsyncJob, KubernetesCluster, ServiceOffering, VirtualMachine};

use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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

impl ClientConfig {
    /// Verified TLS, no extra CA, no project, a 30 s request timeout.
    pub fn new(api_url: &str, api_key: &str, secret_key: &str) -> Self {
        ClientConfig {
            api_url: api_url.to_string(),
            api_key: api_key.to_string(),
            secret_key: secret_key.to_string(),
            ssl_no_verify: false,
            ca_bundle_pem: None,
            project_id: None,
            request_timeout: Duration::from_secs(30),
        }
    }

    /// The same with another request timeout.
    pub fn with_timeout(mut self, request_timeout: Duration) -> Self {
        self.request_timeout = request_timeout;
        self
    }
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("api_url", &self.api_url)
            .field("api_key", &crate::redact::mask(&self.api_key))
            .field("secret_key", &"***")
            .field("ssl_no_verify", &self.ssl_no_verify)
            .field("project_id", &self.project_id)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

/// Page size for list commands that follow paging, until CloudStack names a lower limit (see
/// [`Client::page_size`]).
const DEFAULT_PAGE_SIZE: u32 = 500;

/// How long a signed request stays valid: its `expires` is the wall clock plus this. Long
/// enough for a management server's clock a little behind ours and for a slow answer (the
/// server checks `expires` when the request arrives, not when it answers), short enough that a
/// captured URL cannot be replayed for long.
pub const DEFAULT_SIGNATURE_EXPIRY: Duration = Duration::from_secs(5 * 60);

/// How far before the wanted instant the `startdate` of `listAsyncJobs` is put. The parameter
/// is a DATE: CloudStack reads only `yyyy-MM-dd` and takes midnight in the management
/// server's own time zone (`SimpleDateFormat` with the JVM's default zone), which can be up to
/// 12 hours after midnight UTC (UTC-12). Jobs created before the wanted instant are dropped
/// from the answer by `created` instead.
const STARTDATE_ZONE_SLACK: Duration = Duration::from_secs(12 * 3600);

/// At most this many ids go in one `listVirtualMachines ids=…` request, so the URL stays well
/// under the header size a servlet container accepts (37 characters an id).
const VM_IDS_PER_CALL: usize = 50;

/// Upper bound on pages fetched for one list call, so a server that ignores `page` cannot keep
/// us looping.
const MAX_PAGES: u32 = 10_000;

/// Bodies larger than this are refused rather than buffered.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// Sent with cluster lists: without it CloudStack lists only the caller's own account's
/// clusters, so an admin or domain-admin key would not see a cluster another account owns.
fn listall() -> (&'static str, String) {
    ("listall", "true".to_string())
}

/// How much of an unexpected body an error quotes.
const SNIPPET_CHARS: usize = 200;

/// Connect timeout cap; the whole-request timeout still applies when it is shorter.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A cheap-to-clone CloudStack client (one connection pool).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    /// Page size asked for; CloudStack's limit, once learned, caps it ([`Client::page_size`]).
    page_size: u32,
    /// Added to the wall clock for each request's `expires`.
    signature_expiry: Duration,
}

struct Inner {
    http: reqwest::Client,
    api_url: String,
    api_key: String,
    secret_key: String,
    project_id: Option<String>,
    request_timeout: Duration,
    /// The largest `pagesize` CloudStack accepts, learned from its refusal (0: not known yet).
    /// Shared by every clone, so one refusal serves all list calls.
    page_limit: AtomicU32,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("api_url", &self.inner.api_url)
            .field("api_key", &crate::redact::mask(&self.inner.api_key))
            .field("project_id", &self.inner.project_id)
            .field("page_size", &self.page_size())
            .field("signature_expiry", &self.signature_expiry)
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
const LIST_VMS: ListSpec = ListSpec {
    command: "listVirtualMachines",
    field: "virtualmachine",
};
const SCALE_CLUSTER: &str = "scaleKubernetesCluster";
const STOP_VM: &str = "stopVirtualMachine";
const LIST_CAPABILITIES: &str = "listCapabilities";
const QUERY_JOB: &str = "queryAsyncJobResult";

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
        if url.scheme() == "http" {
            warn_plain_http(url.host_str().unwrap_or_default());
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
                page_limit: AtomicU32::new(0),
            }),
            page_size: DEFAULT_PAGE_SIZE,
            signature_expiry: DEFAULT_SIGNATURE_EXPIRY,
        })
    }

    /// The same client (same pool, same learned page limit) signing each request to expire
    /// `expiry` after it is sent (at least one second; [`DEFAULT_SIGNATURE_EXPIRY`] unless set).
    pub fn with_signature_expiry(mut self, expiry: Duration) -> Self {
        self.signature_expiry = expiry.max(Duration::from_secs(1));
        self
    }

    /// How long after it is sent a request's signature expires.
    pub fn signature_expiry(&self) -> Duration {
        self.signature_expiry
    }

    /// The `pagesize` list calls send: 500, or less once CloudStack has refused a larger one
    /// and named its limit (`default.page.size`).
    pub fn page_size(&self) -> u32 {
        match self.inner.page_limit.load(Ordering::Relaxed) {
            0 => self.page_size,
            limit => self.page_size.min(limit),
        }
    }

    /// How long one request may take before it counts as unanswered.
    pub fn request_timeout(&self) -> Duration {
        self.inner.request_timeout
    }

    /// The same client (same pool) listing with `page_size` items per page (minimum 1), so
    /// tests can page through a handful of items.
    #[cfg(test)]
    fn with_page_size(mut self, page_size: u32) -> Self {
        self.page_size = page_size.max(1);
        self
    }

    /// `listKubernetesClusters id=…`; `Ok(None)` when CloudStack lists none.
    pub async fn get_cluster(&self, id: &str) -> Result<Option<KubernetesCluster>, CsError> {
        let clusters: Vec<KubernetesCluster> = self
            .list_one_page(&LIST_CLUSTERS, vec![("id", id.to_string()), listall()])
            .await?;
        Ok(clusters.into_iter().find(|c| c.id == id))
    }

    /// `listKubernetesClusters name=…` (exact name).
    pub async fn find_clusters_by_name(
        &self,
        name: &str,
    ) -> Result<Vec<KubernetesCluster>, CsError> {
        let clusters: Vec<KubernetesCluster> = self
            .list_all_pages(&LIST_CLUSTERS, vec![("name", name.to_string()), listall()])
            .await?;
        // Documented as a substring match in some versions; keep exact matches only.
        Ok(clusters.into_iter().filter(|c| c.name == name).collect())
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
        self.call_with(QUERY_JOB, &[("jobid", job_id.to_string())], |inner| {
            serde_json::from_str(inner.raw.get())
                .map_err(|e| malformed(QUERY_JOB, format!("job {job_id}: {e}")))
        })
        .await
    }

    /// One page of the jobs created at or after `startdate` (CloudStack's
    /// `yyyy-MM-dd'T'HH:mm:ssZ`, see [`types::cloudstack_date`]), which CloudStack lists oldest
    /// first (by id): [`Client::list_async_jobs_since`] for that instant. A `startdate` in
    /// another form is sent as it is and nothing is filtered. The flag says whether another
    /// page may follow. Read one page at a time so a long job history is never held in memory
    /// whole.
    pub async fn list_async_jobs_page(
        &self,
        startdate: &str,
        page: u32,
    ) -> Result<(Vec<types::ListedJob>, bool), CsError> {
        match types::parse_cloudstack_date(startdate) {
            Some(since) => self.list_async_jobs_since(since, page).await,
            None => {
                self.list_async_jobs(startdate.trim().to_string(), None, page)
                    .await
            }
        }
    }

    /// One page of `listAsyncJobs startdate=yyyy-MM-dd page=… pagesize=…` keeping the jobs
    /// created at or after `since_unix` (seconds since the Unix epoch). `startdate` is a DATE
    /// parameter: CloudStack drops any time part and lists from midnight in its own time zone,
    /// so the date sent is that of `since_unix` less 12 hours (the earliest midnight any zone
    /// can mean) and the jobs created before `since_unix` are dropped here, by `created`; a job
    /// whose `created` is absent or unreadable is kept. The flag says whether another page may
    /// follow (the page CloudStack sent was full, before filtering).
    pub async fn list_async_jobs_since(
        &self,
        since_unix: u64,
        page: u32,
    ) -> Result<(Vec<types::ListedJob>, bool), CsError> {
        let day = types::cloudstack_day(since_unix.saturating_sub(STARTDATE_ZONE_SLACK.as_secs()));
        self.list_async_jobs(day, Some(since_unix), page).await
    }

    async fn list_async_jobs(
        &self,
        startdate: String,
        since_unix: Option<u64>,
        page: u32,
    ) -> Result<(Vec<types::ListedJob>, bool), CsError> {
        let base = self.list_params(vec![("startdate", startdate)]);
        let (mut jobs, _, size) = self
            .list_page::<types::ListedJob>(&LIST_ASYNC_JOBS, &base, page.max(1), self.page_size())
            .await?;
        let more = u32::try_from(jobs.len()).is_ok_and(|n| n >= size);
        if let Some(since) = since_unix {
            jobs.retain(|job| job.created_unix().is_none_or(|created| created >= since));
        }
        Ok((jobs, more))
    }

    /// `listVirtualMachines ids=… listall=true` (with `projectid` when configured): the VMs
    /// CloudStack lists among `vm_ids`, in requests of at most 50 ids, each paged. A VM it
    /// does not list (expunged, or not visible to the key) is absent from the answer. No ids
    /// lists nothing (no request; CloudStack would list every VM).
    pub async fn list_virtual_machines(
        &self,
        vm_ids: &[String],
    ) -> Result<Vec<VirtualMachine>, CsError> {
        if vm_ids
            .iter()
            .any(|id| id.trim().is_empty() || id.contains(','))
        {
            return Err(CsError::Config(format!(
                "{} needs VM ids without commas, got {vm_ids:?}",
                LIST_VMS.command
            )));
        }
        let mut vms = Vec::new();
        for chunk in vm_ids.chunks(VM_IDS_PER_CALL) {
            let params = vec![("ids", chunk.join(",")), listall()];
            let listed: Vec<VirtualMachine> = self.list_all_pages(&LIST_VMS, params).await?;
            vms.extend(listed.into_iter().filter(|vm| chunk.contains(&vm.id)));
        }
        Ok(vms)
    }

    /// `stopVirtualMachine id=…`, with `forced=true` when `forced` (`StopVMCmd`: the VM is
    /// marked Stopped even when the stop command cannot reach its host). Returns the job id;
    /// the job's result holds the VM ([`AsyncJob::result_virtual_machine`]).
    pub async fn stop_virtual_machine(&self, vm_id: &str, forced: bool) -> Result<String, CsError> {
        if vm_id.trim().is_empty() {
            return Err(CsError::Config(format!("{STOP_VM} needs a VM id")));
        }
        let mut params = vec![("id", vm_id.to_string())];
        if forced {
            params.push(("forced", "true".to_string()));
        }
        self.submit_async(STOP_VM, params).await
    }

    /// `listCapabilities`: the `cloudstackversion` CloudStack reports (an upgrade changes it).
    pub async fn cloudstack_version(&self) -> Result<String, CsError> {
        #[derive(serde::Deserialize)]
        struct Capability {
            #[serde(default)]
            cloudstackversion: String,
        }
        #[derive(serde::Deserialize)]
        struct Capabilities {
            capability: Capability,
        }
        self.call_with(LIST_CAPABILITIES, &[], |inner| {
            serde_json::from_str::<Capabilities>(inner.raw.get())
                .map(|c| c.capability.cloudstackversion)
                .map_err(|e| malformed(LIST_CAPABILITIES, e.to_string()))
        })
        .await
    }

    /// `listServiceOfferings id=…`; `Ok(None)` when none.
    pub async fn get_service_offering(&self, id: &str) -> Result<Option<ServiceOffering>, CsError> {
        let offerings: Vec<ServiceOffering> = self
            .list_one_page(&LIST_SERVICE_OFFERINGS, vec![("id", id.to_string())])
            .await?;
        Ok(offerings.into_iter().find(|o| o.id == id))
    }

    /// Sends one signed GET for `command` with `params` (besides `command`, `response`, `apiKey`,
    /// `signature`, which are added) and hands the object inside `<command>response` to `read`
    /// as raw JSON borrowed from the body, so a large answer (a cluster with thousands of VMs)
    /// is deserialised once, straight into typed structs, with no intermediate
    /// `serde_json::Value` or copy. Error envelopes, HTTP failures and unreadable bodies come
    /// back as [`CsError`].
    async fn call_with<T>(
        &self,
        command: &str,
        params: &[(&str, String)],
        read: impl FnOnce(&Answer<'_>) -> Result<T, CsError>,
    ) -> Result<T, CsError> {
        let started = Instant::now();
        let fetched = self.fetch(command, params).await;
        // CloudStack's own time (request sent → whole answer read), recorded apart from the
        // provider's time reading the answer.
        let waited = started.elapsed();
        let result = match fetched {
            Ok((status, body)) => self
                .interpret(command, status, &body)
                .and_then(|inner| read(&inner)),
            Err(e) => Err(e),
        };
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let outcome = match &result {
            Ok(_) => "ok",
            Err(CsError::Unreachable { .. }) => "unreachable",
            Err(CsError::Api { .. }) => "api_error",
            Err(CsError::Unauthorized { .. }) => "unauthorized",
            Err(CsError::NotPermitted { .. }) => "not_permitted",
            Err(CsError::Http { .. }) => "http_error",
            Err(CsError::Malformed { .. }) => "malformed",
            Err(CsError::Config(_)) => "config",
        };
        record_request_metrics(command, waited, outcome);
        match &result {
            Ok(_) => tracing::debug!(command, elapsed_ms, outcome = "ok", "CloudStack call"),
            Err(err) => {
                tracing::debug!(command, elapsed_ms, outcome = "error", error = %err, "CloudStack call")
            }
        }
        result
    }

    /// Sends the signed request; returns the HTTP status and the whole body.
    async fn fetch(
        &self,
        command: &str,
        params: &[(&str, String)],
    ) -> Result<(u16, Vec<u8>), CsError> {
        let inner = &self.inner;
        let mut all: Vec<(String, String)> = Vec::with_capacity(params.len() + 2);
        all.push(("command".to_string(), command.to_string()));
        all.push(("response".to_string(), "json".to_string()));
        all.extend(params.iter().map(|(k, v)| ((*k).to_string(), v.clone())));
        // Signature version 3: the request is refused once `expires` has passed, so a captured
        // URL cannot be replayed later (`ApiServer.verifyRequest`). The wall clock is read here.
        let expires = wall_clock_secs().saturating_add(ceil_secs(self.signature_expiry));
        all.push((
            sign::SIGNATURE_VERSION.0.to_string(),
            sign::SIGNATURE_VERSION.1.to_string(),
        ));
        all.push((sign::EXPIRES.to_string(), sign::expires_value(expires)));
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
        Ok((status, body))
    }

    async fn read_body(
        &self,
        command: &str,
        mut response: reqwest::Response,
    ) -> Result<Vec<u8>, CsError> {
        // Sized once from Content-Length (bounded) so a large answer is not copied while growing.
        let expected = response
            .content_length()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0)
            .min(MAX_BODY_BYTES);
        let mut body = Vec::with_capacity(expected);
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

    /// Turns status + body into the inner response object (raw JSON borrowed from `body`) or
    /// the matching error.
    fn interpret<'b>(
        &self,
        command: &str,
        status: u16,
        body: &'b [u8],
    ) -> Result<Answer<'b>, CsError> {
        let success = (200..300).contains(&status);
        let unauthorized = |detail: String| CsError::Unauthorized {
            command: command.into(),
            http_status: status,
            detail,
        };
        let http = |snippet: String| CsError::Http {
            command: command.into(),
            http_status: status,
            snippet,
        };
        let snippet = || self.snippet(&String::from_utf8_lossy(body));
        // Only the top level is read here; every value stays raw (not copied, not built).
        let top: Option<HashMap<String, &RawValue>> = match serde_json::from_slice(body) {
            Ok(top) => Some(top),
            // Valid JSON that is not an object has no envelope; anything else is unreadable.
            Err(_) if serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok() => None,
            Err(e) => {
                return Err(if status == 401 {
                    unauthorized(snippet())
                } else if !success {
                    http(snippet())
                } else if looks_like_json(&String::from_utf8_lossy(body)) {
                    malformed(command, format!("invalid JSON ({e})"))
                } else {
                    malformed(command, format!("expected JSON, got: {}", snippet()))
                });
            }
        };
        let Some(inner) = top.as_ref().and_then(|top| envelope(top, command)) else {
            return Err(if status == 401 {
                unauthorized(snippet())
            } else if !success {
                http(snippet())
            } else {
                malformed(
                    command,
                    format!(
                        "no \"{}response\" object in: {}",
                        command.to_lowercase(),
                        snippet()
                    ),
                )
            });
        };
        let fields: HashMap<String, &RawValue> = serde_json::from_str(inner.get())
            .map_err(|e| malformed(command, format!("invalid response object ({e})")))?;
        if let Some(errorcode) = fields.get("errorcode") {
            let errorcode =
                raw_number(errorcode, |d| types::lenient::opt_i64(d)).unwrap_or(i64::from(status));
            let cserrorcode = fields
                .get("cserrorcode")
                .and_then(|c| raw_number(c, |d| types::lenient::opt_i64(d)))
                .unwrap_or(0);
            let errortext = fields
                .get("errortext")
                .and_then(|t| serde_json::from_str::<String>(t.get()).ok())
                .map_or_else(|| "(no error text)".to_string(), |t| self.redact(&t));
            // A refused key or signature can also come as a 432; its text tells it apart.
            let auth_text = is_auth_text(&errortext);
            if !auth_text && (errorcode == 432 || is_unavailable_command_text(&errortext)) {
                return Err(CsError::NotPermitted {
                    command: command.into(),
                    detail: format!(
                        "{errortext} (errorcode {errorcode}, cserrorcode {cserrorcode})"
                    ),
                });
            }
            if status == 401 || errorcode == 401 || auth_text {
                return Err(unauthorized(format!("{errortext} (errorcode {errorcode})")));
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
            return Err(unauthorized(snippet()));
        }
        if !success {
            return Err(http(snippet()));
        }
        Ok(Answer { raw: inner, fields })
    }

    /// Submits an async command and returns its `jobid`.
    async fn submit_async(
        &self,
        command: &str,
        params: Vec<(&str, String)>,
    ) -> Result<String, CsError> {
        self.call_with(command, &params, |inner| {
            match inner
                .fields
                .get("jobid")
                .and_then(|raw| serde_json::from_str::<String>(raw.get()).ok())
            {
                Some(id) if !id.is_empty() => Ok(id),
                _ => Err(malformed(command, "no \"jobid\" in the response".into())),
            }
        })
        .await
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
        let (items, _) = self
            .call_with(spec.command, &params, |inner| parse_list(spec, inner))
            .await?;
        Ok(items)
    }

    /// Every page of a list command. Should CloudStack refuse the page size past the first
    /// page (its limit lowered by a restart), the listing starts again at the smaller size,
    /// since the pages already read were cut at the larger one.
    async fn list_all_pages<T: DeserializeOwned>(
        &self,
        spec: &ListSpec,
        params: Vec<(&str, String)>,
    ) -> Result<Vec<T>, CsError> {
        let base = self.list_params(params);
        let mut page_size = self.page_size();
        'listing: loop {
            let mut items = Vec::new();
            for page in 1..=MAX_PAGES {
                let (mut batch, count, used) =
                    self.list_page::<T>(spec, &base, page, page_size).await?;
                if used != page_size {
                    page_size = used;
                    if page > 1 {
                        continue 'listing;
                    }
                }
                let got = batch.len();
                items.append(&mut batch);
                let page_full = u32::try_from(got).is_ok_and(|g| g >= page_size);
                let count_reached =
                    count.is_some_and(|c| u64::try_from(items.len()).unwrap_or(u64::MAX) >= c);
                if !page_full || count_reached {
                    return Ok(items);
                }
            }
            return Err(malformed(
                spec.command,
                format!("paging did not end after {MAX_PAGES} pages"),
            ));
        }
    }

    /// One page of a list command (`base` already holds `projectid`): its items, `count`, and
    /// the page size used. `BaseListCmd.getPageSize` refuses a `pagesize` above
    /// `default.page.size` with 431 "Page size can't exceed max allowed page size value: N";
    /// then N is kept as this client's limit (every list call uses it from then on) and the
    /// same page is asked for again at once with N items.
    async fn list_page<T: DeserializeOwned>(
        &self,
        spec: &ListSpec,
        base: &[(&str, String)],
        page: u32,
        page_size: u32,
    ) -> Result<(Vec<T>, Option<u64>, u32), CsError> {
        let mut size = page_size;
        loop {
            let mut params = base.to_vec();
            params.push(("page", page.to_string()));
            params.push(("pagesize", size.to_string()));
            match self
                .call_with(spec.command, &params, |inner| parse_list::<T>(spec, inner))
                .await
            {
                Ok((items, count)) => return Ok((items, count, size)),
                // The size strictly falls with each retry, so this ends.
                Err(err) => match self.learn_page_limit(spec.command, &err) {
                    Some(limit) if limit < size => size = limit,
                    _ => return Err(err),
                },
            }
        }
    }

    /// The page-size limit a 431 refusal names, kept for the whole client (the smallest
    /// seen wins); `None` for any other error.
    fn learn_page_limit(&self, command: &str, err: &CsError) -> Option<u32> {
        let CsError::Api {
            errorcode: 431,
            errortext,
            ..
        } = err
        else {
            return None;
        };
        let limit = page_limit_in(errortext)?;
        let learned =
            self.inner
                .page_limit
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |known| {
                    (known == 0 || limit < known).then_some(limit)
                });
        if learned.is_ok() {
            tracing::info!(
                command,
                limit,
                "CloudStack refuses larger pages (default.page.size); listing at most {limit} items a page from now on"
            );
        }
        Some(self.page_size().min(limit))
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

/// The object inside a successful answer's envelope, as raw JSON borrowed from the body, and
/// its fields (each still raw: nothing is built until a caller deserialises it).
struct Answer<'b> {
    raw: &'b RawValue,
    fields: HashMap<String, &'b RawValue>,
}

/// The object under `<command lower>response`, or the only `…response` key (some error paths
/// answer with `errorresponse`).
fn envelope<'b>(top: &HashMap<String, &'b RawValue>, command: &str) -> Option<&'b RawValue> {
    let is_object = |raw: &RawValue| raw.get().trim_start().starts_with('{');
    let key = format!("{}response", command.to_lowercase());
    if let Some(inner) = top.get(&key) {
        return is_object(inner).then_some(*inner);
    }
    let mut responses = top
        .iter()
        .filter(|(k, v)| k.ends_with("response") && is_object(v));
    match (responses.next(), responses.next()) {
        (Some((_, inner)), None) => Some(*inner),
        _ => None,
    }
}

/// The items and `count` of a list response; `{}` is an empty list. The items are read straight
/// from the raw JSON into `T`; only when that fails is the list walked item by item, to name
/// the item that is wrong.
fn parse_list<T: DeserializeOwned>(
    spec: &ListSpec,
    inner: &Answer<'_>,
) -> Result<(Vec<T>, Option<u64>), CsError> {
    let fields = &inner.fields;
    let count = fields
        .get("count")
        .and_then(|c| raw_number(c, |d| types::lenient::opt_u64(d)));
    let items = match fields.get(spec.field) {
        None => Vec::new(),
        Some(raw) if raw.get().trim() == "null" => Vec::new(),
        Some(raw) if raw.get().trim_start().starts_with('[') => {
            match serde_json::from_str::<Vec<T>>(raw.get()) {
                Ok(items) => items,
                Err(whole) => {
                    let raw_items: Vec<&RawValue> = serde_json::from_str(raw.get())
                        .map_err(|e| malformed(spec.command, format!("{}: {e}", spec.field)))?;
                    for (i, item) in raw_items.iter().enumerate() {
                        if let Err(e) = serde_json::from_str::<T>(item.get()) {
                            return Err(malformed(
                                spec.command,
                                format!("{}[{i}]: {e}", spec.field),
                            ));
                        }
                    }
                    return Err(malformed(spec.command, format!("{}: {whole}", spec.field)));
                }
            }
        }
        Some(_) => {
            return Err(malformed(
                spec.command,
                format!("\"{}\" is not an array", spec.field),
            ));
        }
    };
    Ok((items, count))
}

/// A number CloudStack sends as a JSON number or a numeric string, read with the lenient
/// reader the typed responses use; `None` when absent, empty or not a number.
fn raw_number<T>(
    raw: &RawValue,
    read: impl FnOnce(
        &mut serde_json::Deserializer<serde_json::de::StrRead<'_>>,
    ) -> serde_json::Result<Option<T>>,
) -> Option<T> {
    read(&mut serde_json::Deserializer::from_str(raw.get()))
        .ok()
        .flatten()
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

/// The page-size limit in CloudStack's refusal "Page size can't exceed max allowed page size
/// value: N" (`BaseListCmd.getPageSize`), when it is at least 1.
fn page_limit_in(errortext: &str) -> Option<u32> {
    const NEEDLE: &str = "max allowed page size value:";
    let lower = errortext.to_ascii_lowercase();
    let rest = lower[lower.find(NEEDLE)? + NEEDLE.len()..].trim_start();
    let digits: &str = &rest[..rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len())];
    let limit: u64 = digits.parse().ok()?;
    (limit >= 1).then(|| u32::try_from(limit).unwrap_or(u32::MAX))
}

/// Texts CloudStack uses when a command does not exist for the caller or its role does not
/// allow it: "The given command does not exist or it is not available for user" (432),
/// "The given command '…' either does not exist, is not available for user." (401 from
/// `ApiServer.verifyRequest`), "The API … does not exist or is not available for this
/// account." (the role checker's `UnavailableCommandException`).
fn is_unavailable_command_text(text: &str) -> bool {
    let lower = text.to_lowercase();
    lower.contains("does not exist") && lower.contains("not available for")
}

/// Seconds since the Unix epoch on the wall clock (0 if it is before 1970).
fn wall_clock_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Whole seconds in `d`, rounded up.
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Warns, once per process, that the API URL is plain HTTP: the API key and every signed URL
/// then travel in clear text, and anyone on the path can read them.
/// True when this call warned.
fn warn_plain_http(host: &str) -> bool {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if WARNED.swap(true, Ordering::Relaxed) {
        return false;
    }
    tracing::warn!(
        host,
        "the CloudStack API URL is http://: the API key and signed requests travel in clear text; use https://"
    );
    true
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

/// Counts a CloudStack request and its wait under the provider's metric names (described,
/// with their help text, by the provider's metrics module). `outcome` is the label value of
/// the request's result: `ok`, `unreachable`, `api_error`, `unauthorized`, …
pub fn record_request_metrics(command: &str, waited: Duration, outcome: &'static str) {
    metrics::counter!("cks_provider_cloudstack_requests_total", "command" => command.to_string(), "outcome" => outcome)
        .increment(1);
    metrics::histogram!("cks_provider_cloudstack_request_duration_seconds", "command" => command.to_string())
        .record(waited.as_secs_f64());
}

#[cfg(test)]
mod tests;
