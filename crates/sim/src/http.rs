//! The HTTP face: `/client/api` over GET (query) and POST (form), fault injection, request
//! recording, authentication, then the command. Dropped connections use a per-connection kill
//! switch: once set, the connection's socket refuses every read and write, so hyper closes it
//! without sending the response.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Bytes;
use axum::extract::connect_info::Connected;
use axum::extract::{ConnectInfo, RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use super::Shared;
use super::access;
use super::accounts::Caller;
use super::api::{self, COMMANDS, Params, SIM_COMMANDS};
use super::model::RecordedRequest;
use super::reply::Reply;
use super::{signing, throttle};

/// A TCP listener whose connections carry a kill switch.
pub struct KillableListener(pub TcpListener);

/// A TCP stream that fails every operation once its kill switch is set.
pub struct KillableStream {
    inner: TcpStream,
    kill: Arc<AtomicBool>,
}

impl Listener for KillableListener {
    type Io = KillableStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (io, addr) = Listener::accept(&mut self.0).await;
        let _ = io.set_nodelay(true);
        (
            KillableStream {
                inner: io,
                kill: Arc::new(AtomicBool::new(false)),
            },
            addr,
        )
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// The kill switch of the connection a request came on.
#[derive(Clone)]
pub struct ConnKill(Arc<AtomicBool>);

impl Connected<IncomingStream<'_, KillableListener>> for ConnKill {
    fn connect_info(stream: IncomingStream<'_, KillableListener>) -> Self {
        Self(stream.io().kill.clone())
    }
}

fn killed() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "connection dropped by fault injection",
    )
}

impl AsyncRead for KillableStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.kill.load(Ordering::SeqCst) {
            return Poll::Ready(Err(killed()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for KillableStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.kill.load(Ordering::SeqCst) {
            return Poll::Ready(Err(killed()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if self.kill.load(Ordering::SeqCst) {
            return Poll::Ready(Err(killed()));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.kill.load(Ordering::SeqCst) {
            return Poll::Ready(Err(killed()));
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/client/api", get(handle).post(handle))
        .with_state(shared)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Error(u16),
    Drop,
    Malformed,
    /// Executed, then a proxy's 504.
    LateError,
}

impl Fault {
    fn label(self) -> &'static str {
        match self {
            Self::Error(_) => "error",
            Self::Drop => "drop",
            Self::Malformed => "malformed",
            Self::LateError => "late-error",
        }
    }
}

/// An answer as 4.21's Jetty sends it (`recorded/*.response.http`): `Content-Type:
/// application/json;charset=utf-8` on every answer; on an error other than 401 the errortext
/// again in `X-Description` (running_20, errors_14, throttle_01; a 401 has none, errors_01);
/// CloudStack's own codes with their number as reason phrase (`432 432`, errors_14; `531 531`,
/// errors_18), where hyper would write `<none>`.
fn json_response(reply: Reply) -> Response {
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let description = (status.as_u16() >= 400 && status != StatusCode::UNAUTHORIZED)
        .then(|| error_text(&reply.body))
        .flatten()
        .and_then(|text| HeaderValue::from_str(&text).ok());
    let mut resp = (status, reply.body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json;charset=utf-8"),
    );
    if let Some(text) = description {
        resp.headers_mut().insert("x-description", text);
    }
    if status.canonical_reason().is_none()
        && let Ok(reason) = hyper::ext::ReasonPhrase::try_from(status.as_str().to_string())
    {
        resp.extensions_mut().insert(reason);
    }
    resp
}

/// The `errortext` of an error envelope (`{"<x>response": {..., "errortext": …}}`).
fn error_text(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let inner = value.as_object()?.values().next()?;
    inner.get("errortext")?.as_str().map(str::to_string)
}

fn proxy_error(status: u16) -> Response {
    let reason = match status {
        502 => "Bad Gateway",
        503 => "Service Temporarily Unavailable",
        _ => "Gateway Time-out",
    };
    let body = format!(
        "<html>\r\n<head><title>{status} {reason}</title></head>\r\n<body>\r\n<center><h1>{status} {reason}</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
    );
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut resp = (code, body).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html"));
    resp
}

async fn handle(
    State(sh): State<Arc<Shared>>,
    ConnectInfo(conn): ConnectInfo<ConnKill>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Response {
    let mut pairs: Vec<(String, String)> =
        url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    pairs.extend(url::form_urlencoded::parse(&body).into_owned());
    let params = Params::from_pairs(pairs);
    let command = params
        .pairs
        .iter()
        .find(|(k, _)| k == "command")
        .map(|(_, v)| v.clone());

    if let Some(name) = command.as_deref().filter(|c| SIM_COMMANDS.contains(c)) {
        let (reply, changed) = {
            let mut w = sh.lock();
            super::control::dispatch_sim(&mut w, name, &params, sh.clock.now_ms())
        };
        if changed {
            sh.settings_changed.notify_waiters();
        }
        return json_response(reply);
    }

    let (fault, latency) = {
        let mut w = sh.lock();
        let s = w.settings.clone();
        let fault = if s.error_rate > 0.0 && w.fault_rng.unit() < s.error_rate {
            let pick = (w.fault_rng.unit() * 3.0) as u16;
            Some(Fault::Error([502, 503, 504][usize::from(pick.min(2))]))
        } else if s.drop_rate > 0.0 && w.fault_rng.unit() < s.drop_rate {
            Some(Fault::Drop)
        } else if s.malformed_rate > 0.0 && w.fault_rng.unit() < s.malformed_rate {
            Some(Fault::Malformed)
        } else if s.late_error_rate > 0.0 && w.fault_rng.unit() < s.late_error_rate {
            Some(Fault::LateError)
        } else {
            None
        };
        let atms = sh.clock.now_ms();
        w.requests.push(RecordedRequest {
            command: command.clone().unwrap_or_default(),
            params: params.recorded(),
            atms,
            fault: fault.map(|f| f.label().to_string()),
        });
        let slower = s
            .command_latency
            .as_ref()
            .filter(|(c, _)| {
                command
                    .as_deref()
                    .is_some_and(|n| n.eq_ignore_ascii_case(c))
            })
            .map_or(std::time::Duration::ZERO, |(_, d)| *d);
        (fault, s.latency + slower)
    };
    if let Some(Fault::Error(status)) = fault {
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        return proxy_error(status);
    }

    // CloudStack (a servlet) runs a command it has received even when the client hangs up
    // while waiting: the command runs in a task of its own, which a dropped connection does
    // not cancel.
    let work = {
        let sh = sh.clone();
        tokio::spawn(async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            authenticated_reply(&sh, command.as_deref(), &params)
        })
    };
    let reply = match work.await {
        Ok(reply) => reply,
        Err(e) => {
            tracing::error!(error = %e, "simulated command task failed");
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
    };

    match fault {
        Some(Fault::Drop) => {
            conn.0.store(true, Ordering::SeqCst);
            StatusCode::OK.into_response()
        }
        Some(Fault::Malformed) => {
            let mut reply = reply;
            let keep = reply.body.len() / 2;
            reply.body.truncate(keep);
            json_response(reply)
        }
        Some(Fault::LateError) => proxy_error(504),
        _ => json_response(reply),
    }
}

const UNAUTHORIZED: &str = "unable to verify user credentials and/or request signature";

fn authenticated_reply(sh: &Arc<Shared>, command: Option<&str>, params: &Params) -> Reply {
    let Some(name) = command else {
        return Reply::error("errorresponse", 401, 0, UNAUTHORIZED);
    };
    let response_name = format!("{}response", name.to_ascii_lowercase());
    // 4.21 answers an unknown command as it answers a bad signature (errors_12), so which it
    // checks first cannot be seen from outside.
    if !COMMANDS.contains(&name) {
        return api::unknown_command(name);
    }
    let settings = sh.lock().settings.clone();
    let (key_api, key_secret) = sh.keys();
    // The key's user: the simulator's own key, or one of the scenario's other accounts.
    let lookup = |key: &str| {
        let w = sh.lock();
        if signing::constant_time_eq(key.as_bytes(), key_api.as_bytes()) {
            Some((key_secret.clone(), w.key_caller()))
        } else {
            w.account_by_key(key)
        }
    };
    // `checkCommandAvailable`'s checkers: the role, the project role, then the API rate limit
    // (their order is *unverified*; see `throttle`). Root admins are never counted
    // (`ApiRateLimitServiceImpl.checkAccess`; throttle_03).
    let refusal = std::cell::RefCell::new(None);
    let verified = signing::verify_with_access(&params.pairs, lookup, |caller: &Caller| {
        if !caller.role.allows(name) {
            *refusal.borrow_mut() = Some(access::unavailable_command(name, caller));
            return Err(signing::AuthFailure::CommandUnavailable);
        }
        if let Some(refused) = sh
            .lock()
            .project_refusal(caller, name, params.get("projectid"))
        {
            *refusal.borrow_mut() = Some(refused);
            return Err(signing::AuthFailure::NotInProject);
        }
        if caller.is_root_admin() {
            return Ok(());
        }
        sh.throttle()
            .check(&caller.account_id, name, &settings, sh.clock.now_ms())
            .map_err(|retry_after_ms| signing::AuthFailure::Throttled { retry_after_ms })
    });
    let caller = match verified {
        Ok(caller) => caller,
        Err(
            why @ (signing::AuthFailure::CommandUnavailable | signing::AuthFailure::NotInProject),
        ) => {
            tracing::debug!(command = name, ?why, "refused by an access checker");
            return refusal
                .into_inner()
                .unwrap_or_else(|| Reply::error(&response_name, 401, 0, UNAUTHORIZED));
        }
        Err(signing::AuthFailure::Throttled { retry_after_ms }) => {
            tracing::debug!(command = name, retry_after_ms, "account over its API limit");
            return throttle::throttled_reply(&response_name, retry_after_ms);
        }
        Err(why) => {
            tracing::debug!(command = name, ?why, "request not authenticated");
            return Reply::error(&response_name, 401, 0, UNAUTHORIZED);
        }
    };
    if !params
        .get("response")
        .is_some_and(|r| r.eq_ignore_ascii_case("json"))
    {
        return Reply::error(
            &response_name,
            431,
            9999,
            "This simulator only serves response=json (CloudStack itself would answer in XML)",
        );
    }
    if name == "getApiLimit" {
        let window = sh
            .throttle()
            .window(&caller.account_id, &settings, sh.clock.now_ms());
        return access::api_limit(
            &caller,
            settings.throttling,
            settings.throttling_max,
            settings.throttling_interval.as_secs(),
            window,
        );
    }
    let (reply, spawn) = {
        let mut w = sh.lock();
        api::dispatch(
            &mut w,
            name,
            params,
            sh.clock.now_ms(),
            &sh.version(),
            &caller,
        )
    };
    if let Some(spawn) = spawn {
        sh.spawn_job(spawn);
    }
    reply
}
