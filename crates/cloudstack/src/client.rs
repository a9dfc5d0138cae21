//! The request: building the client, signing and sending one command, reading its body, and
//! turning the answer's envelope into the typed value a caller asked for or a [`CsError`]. It is
//! the only code that touches HTTP, the keys and the clock of a signature, so that secrets are
//! kept out of errors and logs in one place and every command is counted and timed the same
//! way. Every request waits for its turn under the client's rate limit, and one CloudStack
//! throttles is sent again (`pace`).

use crate::envelope::{
    Answer, NOT_JSON, envelope, is_auth_text, is_project_refusal_text, is_unavailable_command_text,
    looks_like_json, malformed, raw_number, throttle_retry_after,
};
use crate::error::Transport;
use crate::keys::{FixedKeys, KeyPair, KeySource};
use crate::pace::{Backoff, RateLimit};
use crate::{CsError, LOG_TARGET, sign, types};
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
    /// Whole-request timeout (connect + response). A request CloudStack throttles is sent
    /// again within it, counted from its first send.
    pub request_timeout: Duration,
    /// At most this many requests per second, spaced evenly and in the order asked, whoever
    /// asks (`None`: no limit). Keeps the key under CloudStack's `api.throttling.max` per
    /// `api.throttling.interval` when set a little below it.
    pub max_rps: Option<f64>,
    /// Where each request's key pair comes from once the client runs (`None`: `api_key` and
    /// `secret_key` for its whole life). Those two are still required: they are the pair
    /// checked when the client is built.
    pub key_source: Option<Arc<dyn KeySource>>,
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
            max_rps: None,
            key_source: None,
        }
    }

    /// The same with another request timeout.
    pub fn with_timeout(mut self, request_timeout: Duration) -> Self {
        self.request_timeout = request_timeout;
        self
    }

    /// The same with a rate limit (`None`: none).
    pub fn with_max_rps(mut self, max_rps: Option<f64>) -> Self {
        self.max_rps = max_rps;
        self
    }

    /// The same, each request signed with the pair `source` holds when it is sent.
    pub fn with_key_source(mut self, source: Arc<dyn KeySource>) -> Self {
        self.key_source = Some(source);
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
            .field("max_rps", &self.max_rps)
            .field("key_source", &self.key_source.is_some())
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

/// Bodies larger than this are refused rather than buffered.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// How much of an unexpected body an error quotes.
const SNIPPET_CHARS: usize = 200;

/// Connect timeout cap; the whole-request timeout still applies when it is shorter.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A cheap-to-clone CloudStack client (one connection pool).
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
    /// Page size asked for; CloudStack's limit, once learned, caps it ([`Client::page_size`]).
    page_size: u32,
    /// Added to the wall clock for each request's `expires`.
    signature_expiry: Duration,
}

pub(crate) struct Inner {
    http: reqwest::Client,
    api_url: String,
    keys: Arc<dyn KeySource>,
    pub(crate) project_id: Option<String>,
    request_timeout: Duration,
    /// The client's own rate limit, shared by every clone (`None`: none).
    rate: Option<RateLimit>,
    max_rps: Option<f64>,
    /// The largest `pagesize` CloudStack accepts, learned from its refusal (0: not known yet).
    /// Shared by every clone, so one refusal serves all list calls.
    pub(crate) page_limit: AtomicU32,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("api_url", &self.inner.api_url)
            .field(
                "api_key",
                &crate::redact::mask(&self.inner.keys.current().api_key),
            )
            .field("project_id", &self.inner.project_id)
            .field("max_rps", &self.inner.max_rps)
            .field("page_size", &self.page_size())
            .field("signature_expiry", &self.signature_expiry)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// The `projectid` sent with every list call, if any.
    pub fn project_id(&self) -> Option<&str> {
        self.inner.project_id.as_deref()
    }

    /// The API URL requests go to (no credentials in it), for logs naming which CloudStack.
    pub fn api_url(&self) -> &str {
        &self.inner.api_url
    }

    /// Builds the client; fails on a bad URL or an unreadable CA bundle.
    pub fn new(config: ClientConfig) -> Result<Self, CsError> {
        Self::new_with(config, |b| b)
    }

    /// [`Client::new`], the HTTP client's builder changed by `adjust` last (tests: a resolver
    /// of their own, so a DNS failure needs no DNS server).
    pub(crate) fn new_with(
        config: ClientConfig,
        adjust: impl FnOnce(reqwest::ClientBuilder) -> reqwest::ClientBuilder,
    ) -> Result<Self, CsError> {
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
        let rate = config
            .max_rps
            .map(RateLimit::new)
            .transpose()
            .map_err(CsError::Config)?;
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
            tracing::warn!(target: LOG_TARGET, api_url = %config.api_url, "TLS certificate verification disabled (ssl-no-verify)");
            builder = builder.tls_danger_accept_invalid_certs(true);
        }
        let http = adjust(builder).build().map_err(|e| {
            CsError::Config(format!("HTTP client: {}", error_chain(&e.without_url())))
        })?;
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                api_url: url.to_string(),
                keys: config.key_source.unwrap_or_else(|| {
                    Arc::new(FixedKeys(Arc::new(KeyPair::new(
                        config.api_key,
                        config.secret_key,
                    ))))
                }),
                project_id: config.project_id.filter(|p| !p.is_empty()),
                request_timeout: config.request_timeout,
                rate,
                max_rps: config.max_rps,
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

    /// The client's rate limit in requests per second (`None`: none).
    pub fn max_rps(&self) -> Option<f64> {
        self.inner.max_rps
    }

    /// The same client (same pool) listing with `page_size` items per page (minimum 1), so
    /// tests can page through a handful of items.
    #[cfg(test)]
    pub(crate) fn with_page_size(mut self, page_size: u32) -> Self {
        self.page_size = page_size.max(1);
        self
    }

    /// Sends one signed GET for `command` with `params` (besides `command`, `response`, `apiKey`,
    /// `signature`, which are added) and hands the object inside `<command>response` to `read`
    /// as raw JSON borrowed from the body, so a large answer (a cluster with thousands of VMs)
    /// is deserialised once, straight into typed structs, with no intermediate
    /// `serde_json::Value` or copy. Error envelopes, HTTP failures and unreadable bodies come
    /// back as [`CsError`].
    ///
    /// The request is sent in its turn under the rate limit and, while CloudStack throttles it
    /// and the request timeout (from the first send) allows, sent again after a wait: a
    /// throttled request ran nothing (see `pace`). Each throttled try is counted in the
    /// request metrics (outcome `throttled`), with CloudStack's time on it (request sent →
    /// whole answer read).
    pub(crate) async fn call_with<T>(
        &self,
        command: &str,
        params: &[(&str, String)],
        read: impl FnOnce(&Answer<'_>) -> Result<T, CsError>,
    ) -> Result<T, CsError> {
        let started = Instant::now();
        let mut backoff: Option<Backoff> = None;
        let mut last = None;
        let (fetched, waited) = loop {
            if let Some(rate) = &self.inner.rate {
                rate.turn().await;
            }
            let b = backoff.get_or_insert_with(|| Backoff::new(self.inner.request_timeout));
            let timeout = match (b.remaining(), last.take()) {
                (Some(left), _) => left,
                // The wait for a turn used up the time: the throttled answer stands.
                (None, Some(last)) => break last,
                (None, None) => self.inner.request_timeout,
            };
            let sent = Instant::now();
            let fetched = self.fetch(command, params, timeout).await;
            let waited = sent.elapsed();
            // CloudStack answers its throttling with HTTP 429 (`ApiServlet`); the envelope
            // says whether it is CloudStack's and how long its window lasts.
            let hint = match &fetched {
                Ok((429, body)) => match self.interpret(command, 429, body) {
                    Err(CsError::Throttled { detail, .. }) => Some(throttle_retry_after(&detail)),
                    _ => None,
                },
                _ => None,
            };
            let Some(delay) = hint.and_then(|hint| b.delay(hint)) else {
                break (fetched, waited);
            };
            record_request_metrics(command, waited, "throttled");
            tracing::debug!(target: LOG_TARGET, command, ?delay, "CloudStack throttled the call; sending it again");
            tokio::time::sleep(delay).await;
            last = Some((fetched, waited));
        };
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
            Err(CsError::Throttled { .. }) => "throttled",
            Err(CsError::Http { .. }) => "http_error",
            Err(CsError::Malformed { .. }) => "malformed",
            Err(CsError::Config(_)) => "config",
        };
        record_request_metrics(command, waited, outcome);
        match &result {
            Ok(_) => {
                tracing::debug!(target: LOG_TARGET, command, elapsed_ms, outcome = "ok", "CloudStack call")
            }
            Err(err) => {
                tracing::debug!(target: LOG_TARGET, command, elapsed_ms, outcome = "error", error = %err, "CloudStack call")
            }
        }
        result
    }

    /// Sends the signed request; returns the HTTP status and the whole body.
    async fn fetch(
        &self,
        command: &str,
        params: &[(&str, String)],
        timeout: Duration,
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
        let keys = inner.keys.current();
        if !keys.is_complete() {
            return Err(CsError::Config(
                "no API key or secret key to sign the request with".into(),
            ));
        }
        let query = sign::signed_query(&all, &keys.api_key, &keys.secret_key);
        let url = format!("{}?{}", inner.api_url, query);

        let response = inner
            .http
            .get(url)
            .timeout(timeout)
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
        let cause = transport_cause(&err);
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
            cause,
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
                    malformed(command, format!("{NOT_JSON}{}", snippet()))
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
            // CloudStack's API throttling (`ApiServer.commandAvailable` on the rate-limit
            // plugin's `RequestLimitException`): answered before the command runs, and not a
            // refused key whatever the text says.
            if errorcode == 429 {
                return Err(CsError::Throttled {
                    command: command.into(),
                    detail: format!(
                        "{errortext} (errorcode {errorcode}, cserrorcode {cserrorcode})"
                    ),
                });
            }
            // A refused key or signature can also come as a 432; its text tells it apart. So
            // does the project role's 432: the `projectid` sent is refused, not the command
            // (a refusal of the request, `CsError::is_bad_project`).
            let auth_text = is_auth_text(&errortext);
            if !auth_text
                && !is_project_refusal_text(&errortext)
                && (errorcode == 432 || is_unavailable_command_text(&errortext))
            {
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

    /// Removes the API key, secret and any signature from text bound for errors or logs.
    fn redact(&self, text: &str) -> String {
        let keys = self.inner.keys.current();
        let mut out = text.to_string();
        for secret in [keys.secret_key.as_str(), keys.api_key.as_str()] {
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
pub(crate) fn warn_plain_http(host: &str) -> bool {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if WARNED.swap(true, Ordering::Relaxed) {
        return false;
    }
    tracing::warn!(
        target: LOG_TARGET,
        host,
        "the CloudStack API URL is http://: the API key and signed requests travel in clear text; use https://"
    );
    true
}

/// What the transport ran into, read from the error and its causes: reqwest's own kinds
/// (timeout, DNS), the I/O error's kind, and the rustls error a TLS handshake ended with
/// (tokio-rustls carries it inside an I/O error).
fn transport_cause(err: &reqwest::Error) -> Transport {
    if err.is_timeout() {
        return Transport::Timeout;
    }
    if err.is_dns() {
        return Transport::Dns;
    }
    let mut found = Transport::Other;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        let tls = rustls_error(e);
        match tls {
            Some(rustls::Error::InvalidMessage(_)) => return Transport::TlsToPlainPort,
            Some(rustls::Error::InvalidCertificate(_)) => return Transport::Certificate,
            _ => {}
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => return Transport::Refused,
                std::io::ErrorKind::TimedOut => return Transport::Timeout,
                std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::BrokenPipe => found = Transport::Closed,
                _ => {}
            }
        }
        if let Some(h) = e.downcast_ref::<hyper::Error>()
            && h.is_incomplete_message()
        {
            found = Transport::Closed;
        }
        source = e.source();
    }
    found
}

/// The rustls error `e` is, or carries inside an I/O error (tokio-rustls wraps it so, and an
/// I/O error's `source` skips what it wraps).
fn rustls_error<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e rustls::Error> {
    if let Some(tls) = e.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    let inner = e.downcast_ref::<std::io::Error>()?.get_ref()?;
    rustls_error(inner)
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
