//! CloudStack client errors, split by what the caller does about them.

/// What went wrong talking to CloudStack.
#[derive(Debug, thiserror::Error)]
pub enum CsError {
    /// No answer: connect refused, DNS, TLS handshake, timeout, connection dropped. Retry later;
    /// the autoscaler sees UNAVAILABLE.
    #[error("CloudStack unreachable ({command}): {detail}")]
    Unreachable { command: String, detail: String },
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
