//! What CloudStack's answers look like around the value: the `<command>response` envelope, its
//! error fields and the texts that tell a refused key or a forbidden command apart. Pure
//! functions over the raw JSON, apart from the transport, so that each reading of CloudStack's
//! conventions (numbers sent as strings, `errorresponse`, a 432 that means two things) is
//! written once and does not depend on how the body arrived.

use crate::CsError;
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::time::Duration;

/// The object inside a successful answer's envelope, as raw JSON borrowed from the body, and
/// its fields (each still raw: nothing is built until a caller deserialises it).
pub(crate) struct Answer<'b> {
    pub(crate) raw: &'b RawValue,
    pub(crate) fields: HashMap<String, &'b RawValue>,
}

/// The object under `<command lower>response`, or the only `…response` key (some error paths
/// answer with `errorresponse`).
pub(crate) fn envelope<'b>(
    top: &HashMap<String, &'b RawValue>,
    command: &str,
) -> Option<&'b RawValue> {
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

/// A number CloudStack sends as a JSON number or a numeric string, read with the lenient
/// reader the typed responses use; `None` when absent, empty or not a number.
pub(crate) fn raw_number<T>(
    raw: &RawValue,
    read: impl FnOnce(
        &mut serde_json::Deserializer<serde_json::de::StrRead<'_>>,
    ) -> serde_json::Result<Option<T>>,
) -> Option<T> {
    read(&mut serde_json::Deserializer::from_str(raw.get()))
        .ok()
        .flatten()
}

pub(crate) fn malformed(command: &str, detail: String) -> CsError {
    CsError::Malformed {
        command: command.to_string(),
        detail,
    }
}

pub(crate) fn looks_like_json(text: &str) -> bool {
    matches!(text.trim_start().chars().next(), Some('{' | '['))
}

/// Texts CloudStack uses when a command does not exist for the caller or its role does not
/// allow it: "The given command does not exist or it is not available for user" (432),
/// "The given command '…' either does not exist, is not available for user." (401 from
/// `ApiServer.verifyRequest`), "The API … does not exist or is not available for this
/// account." (the role checker's `UnavailableCommandException`).
pub(crate) fn is_unavailable_command_text(text: &str) -> bool {
    let lower = text.to_lowercase();
    lower.contains("does not exist") && lower.contains("not available for")
}

/// The 432 of CloudStack's project role check (`ProjectRoleBasedApiAccessChecker`): a call
/// whose `projectid` names a project the key's account is not a member of, "The API
/// [listKubernetesClusters] does not exist or is not available for this account/user in project
/// [<uuid>]." (`errors_25` of the 4.21 recordings). It refuses the project, not the command: a
/// member's key may call it.
pub(crate) fn is_project_refusal_text(text: &str) -> bool {
    text.to_lowercase()
        .contains("not available for this account/user in project")
}

/// Error texts CloudStack uses when the key or signature is refused.
pub(crate) fn is_auth_text(text: &str) -> bool {
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

/// What is left of CloudStack's throttling window, as its 429 text names it: "… please retry
/// after [734] ms." (`ApiRateLimitServiceImpl.throwExceptionDueToApiRateLimitReached`; older
/// releases write "after 734 ms."). `None` when the text names no number.
pub(crate) fn throttle_retry_after(text: &str) -> Option<Duration> {
    const NEEDLE: &str = "retry after";
    // ASCII lower-casing keeps byte offsets, so the index is valid in `text`.
    let at = text.to_ascii_lowercase().find(NEEDLE)? + NEEDLE.len();
    let rest = text[at..].trim_start().trim_start_matches('[');
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..digits].parse().ok().map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_cloudstacks_throttling_names() {
        let now =
            "The given user has reached his/her account api limit, please retry after [734] ms.";
        let old = "The given user has reached his/her account api limit, please retry after 12 ms.";
        assert_eq!(throttle_retry_after(now), Some(Duration::from_millis(734)));
        assert_eq!(throttle_retry_after(old), Some(Duration::from_millis(12)));
        assert_eq!(throttle_retry_after("please retry after [] ms."), None);
        assert_eq!(throttle_retry_after("slow down"), None);
        assert!(!is_auth_text(now), "a throttled key is not a refused key");
    }
}
