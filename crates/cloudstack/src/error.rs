//! CloudStack client errors, split by what the caller does about them.

/// What went wrong talking to CloudStack.
#[derive(Debug, thiserror::Error)]
pub enum CsError {
    /// No answer: connect refused, DNS, TLS handshake, timeout, connection dropped. Retry later;
    /// the autoscaler sees UNAVAILABLE.
    #[error("CloudStack unreachable ({command}): {detail}")]
    Unreachable {
        command: String,
        detail: String,
        /// What the transport ran into, read from the error's causes (not from its text).
        cause: Transport,
    },
    /// CloudStack answered with its error envelope (`errorcode`, `cserrorcode`, `errortext`).
    #[error(
        "CloudStack refused {command}: {errortext} (errorcode {errorcode}, cserrorcode {cserrorcode})"
    )]
    Api {
        command: String,
        http_status: u16,
        errorcode: i64,
        cserrorcode: i64,
        errortext: String,
    },
    /// HTTP 401 / 432-with-auth text: the key or signature was refused.
    #[error(
        "CloudStack rejected the API key or signature for {command} (HTTP {http_status}): {detail}"
    )]
    Unauthorized {
        command: String,
        http_status: u16,
        detail: String,
    },
    /// The command does not exist for this API key or its role does not allow it: CloudStack's
    /// 432 "The given command does not exist or it is not available for user" (`ApiServer`
    /// on an `UnavailableCommandException` from the role checker, or an unknown command), or
    /// the 401 "The given command '…' either does not exist, is not available for user" that
    /// `ApiServer.verifyRequest` (`commandAvailable`) answers when the role check throws
    /// `PermissionDeniedException`. The key itself was accepted. Asking again gives the same
    /// answer, so this is never retried; a caller can note once that the command is
    /// unavailable (e.g. the Project Kubernetes Service Role lacks `listAsyncJobs`). CloudStack
    /// 4.21 answers a command it does not have with the 401 of a refused key instead
    /// (`errors_12` of the 4.21 recordings), which reads as [`CsError::Unauthorized`].
    #[error("the API key may not call {command}: {detail}")]
    NotPermitted { command: String, detail: String },
    /// CloudStack's API throttling refused the request: the key's account made more calls
    /// than `api.throttling.max` within `api.throttling.interval` (HTTP 429, errorcode 429,
    /// "The given user has reached his/her account api limit, please retry after [N] ms.").
    /// CloudStack answers it before the command runs (`ApiServer.verifyRequest`, the
    /// rate-limit plugin's `RequestLimitException`), so nothing happened: not a refusal of the
    /// request, not a refused key. The client has already sent it again, with growing waits,
    /// for as long as its request timeout allowed; the caller should slow down.
    #[error(
        "CloudStack throttled {command}: the API key's account is over its API rate limit \
         (api.throttling): {detail}"
    )]
    Throttled { command: String, detail: String },
    /// A non-success HTTP status without a CloudStack envelope (proxy error page, 5xx HTML...).
    #[error("CloudStack returned HTTP {http_status} for {command}: {snippet}")]
    Http {
        command: String,
        http_status: u16,
        snippet: String,
    },
    /// The body could not be understood (not JSON, truncated, missing fields, wrong types).
    #[error("CloudStack sent a response to {command} this provider cannot read: {detail}")]
    Malformed { command: String, detail: String },
    /// The client could not be built (bad URL, unreadable CA bundle).
    #[error("CloudStack client configuration: {0}")]
    Config(String),
}

/// Why a request got no answer at all: the part of [`CsError::Unreachable`] that tells an
/// operator which part of the API URL (or the path to it) to look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Nothing listens at the URL's host and port: the connection was refused.
    Refused,
    /// The URL's host name does not resolve.
    Dns,
    /// A TLS handshake with a peer that answered in plain text (rustls: "received corrupt
    /// message of type InvalidContentType"): an `https://` URL naming a plain-HTTP port.
    TlsToPlainPort,
    /// The server's TLS certificate was not accepted (an unknown issuer, another name, expired).
    Certificate,
    /// No answer within the request timeout (packets dropped, or a server that never answers).
    Timeout,
    /// The peer closed or reset the connection without an HTTP answer: a port that serves
    /// something else than HTTP(S), or a connection cut part-way.
    Closed,
    /// Anything else.
    Other,
}

/// What a failed call says about the API URL itself, when the answer did not come from
/// CloudStack's API at all ([`CsError::api_url_problem`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UrlProblem {
    /// No answer: the transport's reason.
    Unreachable(Transport),
    /// An answer that is a page, not CloudStack's JSON: the UI's address, a login page, or a
    /// proxy's own page (an HTML body when `html`).
    Page { http_status: u16, html: bool },
    /// HTTP 404: the host answers, but not at this path.
    NotFound,
}

/// What a failed call tells about the request: the one classification of CloudStack's
/// answers that the provider's decisions start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// CloudStack answered with its own error envelope: it refused the request, which did
    /// not run (`ApiServer` answers validation and entity errors before queueing a job).
    Refused,
    /// CloudStack's API rate limit refused it before it ran: nothing happened.
    Throttled,
    /// The key or the signature was refused: nothing ran, and nothing will until the key is
    /// fixed.
    Unauthorized,
    /// The key may not call this command: nothing ran, and asking again gives the same answer.
    NotPermitted,
    /// Whether the request ran is unknown: no answer (connection refused or dropped, a
    /// timeout), an answer cut or garbled, or an answer that is not CloudStack's (a proxy's
    /// 502/503/504 page, which a proxy also sends when CloudStack took longer than its read
    /// timeout to answer a request it carried out). Settled by reading CloudStack, never
    /// taken as a refusal.
    Unknown,
    /// Nothing was sent (the client's own configuration).
    NotSent,
}

impl CsError {
    /// Whether the failure shows that the API URL does not reach CloudStack's API (no answer,
    /// or an answer that is not CloudStack's), and how; `None` when CloudStack answered
    /// (its error envelope, a refused key, throttling) or the client was never built.
    pub fn api_url_problem(&self) -> Option<UrlProblem> {
        match self {
            CsError::Unreachable { cause, .. } => Some(UrlProblem::Unreachable(*cause)),
            CsError::Http {
                http_status: 404, ..
            } => Some(UrlProblem::NotFound),
            CsError::Http {
                http_status,
                snippet,
                ..
            } => Some(UrlProblem::Page {
                http_status: *http_status,
                html: is_html(snippet),
            }),
            CsError::Malformed { detail, .. } => detail
                .strip_prefix(crate::envelope::NOT_JSON)
                .map(|body| UrlProblem::Page {
                    http_status: 200,
                    html: is_html(body),
                }),
            _ => None,
        }
    }

    /// What this failure says of the request (see [`Class`]).
    pub fn class(&self) -> Class {
        match self {
            CsError::Api { errorcode: 429, .. } | CsError::Throttled { .. } => Class::Throttled,
            CsError::Api { .. } => Class::Refused,
            CsError::Unauthorized { .. } => Class::Unauthorized,
            CsError::NotPermitted { .. } => Class::NotPermitted,
            CsError::Unreachable { .. } | CsError::Malformed { .. } | CsError::Http { .. } => {
                Class::Unknown
            }
            CsError::Config(_) => Class::NotSent,
        }
    }

    /// Worth asking again later: nothing says the same answer would come back (no answer,
    /// a proxy's page, garbage, the rate limit).
    pub fn is_transient(&self) -> bool {
        matches!(self.class(), Class::Unknown | Class::Throttled)
    }

    /// The key may not call this command (see [`CsError::NotPermitted`]).
    pub fn is_not_permitted(&self) -> bool {
        matches!(self, CsError::NotPermitted { .. })
    }

    /// CloudStack refused a parameter of the request, not the command: 430 (a malformed
    /// value) or 431 (an id that names no entity, `ParamProcessWorker`). The role's access
    /// check runs before the parameters are read (`ApiServer.verifyRequest`), so such an
    /// answer also says the key may call the command.
    pub fn is_parameter_refused(&self) -> bool {
        matches!(
            self,
            CsError::Api {
                errorcode: 430 | 431,
                ..
            }
        )
    }

    /// CloudStack's lookup of an id parameter found no such entity (431): what the id named
    /// is gone, or was never there; not something a retry fixes.
    pub fn names_no_entity(&self) -> bool {
        matches!(self, CsError::Api { errorcode: 431, .. })
    }

    /// CloudStack refused the `projectid` the client sent: it names no project (431: the UUID
    /// names no entity, or "Unable to find project by id"), or one the key's account is not a
    /// member of (432 "… not available for this account/user in project [<uuid>]." from the
    /// project role check, as 4.21 answers it: `errors_25`; 531 "can't access project" from
    /// `AccountManagerImpl.buildACLSearchParameters`, where that check lets a call through);
    /// `ParamProcessWorker` and those checks word them so.
    pub fn is_bad_project(&self) -> bool {
        match self {
            CsError::Api {
                errorcode: 431 | 432 | 531,
                errortext,
                ..
            } => {
                let t = errortext.to_ascii_lowercase();
                t.contains("parameter projectid")
                    || t.contains("project by id")
                    || t.contains("access project")
                    || crate::envelope::is_project_refusal_text(&t)
            }
            _ => false,
        }
    }
}

/// Whether a body (or its excerpt) is an HTML page.
fn is_html(body: &str) -> bool {
    let t = body.trim_start().to_ascii_lowercase();
    t.starts_with("<!doctype html")
        || t.starts_with("<html")
        || t.starts_with("<?xml")
        || t.starts_with("<head")
        || t.starts_with("<body")
        || (t.starts_with('<') && t.contains("</"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(errorcode: i64) -> CsError {
        CsError::Api {
            command: "scaleKubernetesCluster".into(),
            http_status: errorcode as u16,
            errorcode,
            cserrorcode: 9999,
            errortext: "x".into(),
        }
    }

    /// Only CloudStack's own envelope is a refusal; any answer that is not CloudStack's, or
    /// none, leaves the outcome unknown.
    #[test]
    fn every_answer_has_one_class() {
        let http = |http_status| CsError::Http {
            command: "c".into(),
            http_status,
            snippet: "<html>".into(),
        };
        let cases = [
            (api(431), Class::Refused),
            (api(530), Class::Refused),
            (api(429), Class::Throttled),
            (http(502), Class::Unknown),
            (http(504), Class::Unknown),
            (http(404), Class::Unknown),
            (
                CsError::Unreachable {
                    command: "c".into(),
                    detail: "reset".into(),
                    cause: Transport::Closed,
                },
                Class::Unknown,
            ),
            (
                CsError::Malformed {
                    command: "c".into(),
                    detail: "cut".into(),
                },
                Class::Unknown,
            ),
            (
                CsError::Throttled {
                    command: "c".into(),
                    detail: "retry after".into(),
                },
                Class::Throttled,
            ),
            (
                CsError::Unauthorized {
                    command: "c".into(),
                    http_status: 401,
                    detail: "sig".into(),
                },
                Class::Unauthorized,
            ),
            (
                CsError::NotPermitted {
                    command: "c".into(),
                    detail: "role".into(),
                },
                Class::NotPermitted,
            ),
            (CsError::Config("url".into()), Class::NotSent),
        ];
        for (e, class) in cases {
            assert_eq!(e.class(), class, "{e}");
            assert_eq!(
                e.is_transient(),
                matches!(class, Class::Unknown | Class::Throttled),
                "{e}"
            );
        }
    }
}
