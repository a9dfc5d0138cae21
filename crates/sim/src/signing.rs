//! Request authentication as CloudStack's `ApiServer.verifyRequest` does it: every parameter but
//! `signature`, sorted by name, `name=value` with the value encoded like Java's `URLEncoder`
//! (`+` then replaced by `%20`), joined with `&`, lower-cased, HMAC-SHA1 with the secret key,
//! Base64. Signature version 3 also needs an unexpired `expires`.

use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use super::clock;

/// What Java's `URLEncoder` leaves alone: letters, digits and `. - * _` (space becomes `+`,
/// which CloudStack then turns into `%20`, the same as encoding it here).
const JAVA_URLENCODER: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'.')
    .remove(b'-')
    .remove(b'*')
    .remove(b'_');

/// The string CloudStack signs, before lower-casing.
pub fn string_to_sign(params: &[(String, String)]) -> String {
    let mut sorted: Vec<&(String, String)> = params
        .iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("signature"))
        .collect();
    // Java's natural String order on UTF-16 units equals byte order for the ASCII names used.
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    sorted
        .iter()
        .map(|(k, v)| format!("{k}={}", utf8_percent_encode(v, JAVA_URLENCODER)))
        .collect::<Vec<_>>()
        .join("&")
}

/// Base64 HMAC-SHA1 of the lower-cased string to sign.
pub fn compute_signature(params: &[(String, String)], secret_key: &str) -> String {
    let text = string_to_sign(params).to_lowercase();
    let mut mac = match Hmac::<sha1::Sha1>::new_from_slice(secret_key.as_bytes()) {
        Ok(m) => m,
        // HMAC accepts keys of any length; this branch cannot be taken.
        Err(_) => return String::new(),
    };
    mac.update(text.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

/// Why a request was not authenticated (logged, never sent: CloudStack answers every case with
/// the same 401 text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthFailure {
    MissingApiKey,
    MissingSignature,
    UnknownApiKey,
    MissingExpires,
    BadExpires,
    Expired,
    BadSignature,
    /// The key's account may not call the command: `ApiServer.verifyRequest` calls
    /// `commandAvailable` after finding the key's user and before checking the signature, and
    /// the role checker's `UnavailableCommandException` becomes a 432 (not a 401).
    CommandUnavailable,
    /// The call names a project (`projectid`) the key's account is not a member of: the
    /// project role checker, in the same step, refuses it with a 432 of its own (see
    /// `accounts`).
    NotInProject,
    /// The key's account is over its API limit (`api.throttling.*`): the rate-limit checker,
    /// in the same `commandAvailable` step, throws `RequestLimitException`, answered 429
    /// (see `throttle`). The window ends in `retry_after_ms`.
    Throttled {
        retry_after_ms: u64,
    },
}

/// Checks the `apiKey` and `signature` of `params` (first value of each name).
#[cfg(test)]
pub fn verify(
    params: &[(String, String)],
    api_key: &str,
    secret_key: &str,
) -> Result<(), AuthFailure> {
    verify_with_access(
        params,
        |key| {
            constant_time_eq(key.as_bytes(), api_key.as_bytes())
                .then(|| (secret_key.to_string(), ()))
        },
        |_| Ok(()),
    )
}

/// [`verify`] against every key `lookup` knows (it gives a key's secret and its user), with
/// `ApiServer`'s access checkers (`command_available` on that user: the role check, the
/// project role check, then the API rate limit) where CloudStack runs them: once the key is
/// known, before the signature. Returns the key's user.
pub fn verify_with_access<T>(
    params: &[(String, String)],
    lookup: impl FnOnce(&str) -> Option<(String, T)>,
    command_available: impl FnOnce(&T) -> Result<(), AuthFailure>,
) -> Result<T, AuthFailure> {
    let get = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    let key = get("apiKey").ok_or(AuthFailure::MissingApiKey)?;
    let signature = get("signature").ok_or(AuthFailure::MissingSignature)?;
    if get("signatureVersion") == Some("3") {
        let expires = get("expires").ok_or(AuthFailure::MissingExpires)?;
        let at = clock::parse_stamp(expires)
            .or_else(|| legacy_stamp(expires).and_then(|s| clock::parse_stamp(&s)))
            .ok_or(AuthFailure::BadExpires)?;
        if at < clock::unix_now() {
            return Err(AuthFailure::Expired);
        }
    }
    let (secret_key, user) = lookup(key).ok_or(AuthFailure::UnknownApiKey)?;
    command_available(&user)?;
    let expected = compute_signature(params, &secret_key);
    if constant_time_eq(signature.as_bytes(), expected.as_bytes()) {
        Ok(user)
    } else {
        Err(AuthFailure::BadSignature)
    }
}

/// `DateUtil.parseTZDateString`'s legacy form `yyyy-MM-dd'T'HH:mm:ss'Z'Z`
/// (`2024-01-02T03:04:05Z+0000`, the only form older releases parse, and the last one newer
/// releases try) rewritten without the literal `Z`.
fn legacy_stamp(s: &str) -> Option<String> {
    let (date_time, rest) = (s.get(..19)?, s.get(19..)?);
    let offset = rest.strip_prefix('Z')?;
    offset
        .starts_with(['+', '-'])
        .then(|| format!("{date_time}{offset}"))
}

pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn encodes_like_java_and_sorts_by_name() {
        let params = p(&[
            ("name", "a b~c*d"),
            ("command", "listZones"),
            ("apiKey", "K"),
            ("signature", "x"),
        ]);
        assert_eq!(
            string_to_sign(&params),
            "apiKey=K&command=listZones&name=a%20b%7Ec*d"
        );
    }

    #[test]
    fn map_keys_stay_raw() {
        let params = p(&[("nodeofferings[0].node", "worker")]);
        assert_eq!(string_to_sign(&params), "nodeofferings[0].node=worker");
    }

    #[test]
    fn verifies_its_own_signature_and_rejects_others() {
        let mut params = p(&[
            ("command", "listZones"),
            ("apiKey", "K"),
            ("response", "json"),
        ]);
        let sig = compute_signature(&params, "S");
        params.push(("signature".into(), sig));
        assert_eq!(verify(&params, "K", "S"), Ok(()));
        assert_eq!(
            verify(&params, "K", "other"),
            Err(AuthFailure::BadSignature)
        );
        assert_eq!(verify(&params, "K2", "S"), Err(AuthFailure::UnknownApiKey));
        params.pop();
        assert_eq!(
            verify(&params, "K", "S"),
            Err(AuthFailure::MissingSignature)
        );
    }

    #[test]
    fn version_3_needs_an_unexpired_expires_in_any_form_cloudstack_parses() {
        let signed = |expires: &str| {
            let mut params = p(&[
                ("command", "listZones"),
                ("apiKey", "K"),
                ("response", "json"),
                ("signatureversion", "3"),
                ("expires", expires),
            ]);
            let sig = compute_signature(&params, "S");
            params.push(("signature".into(), sig));
            verify(&params, "K", "S")
        };
        assert_eq!(signed("2999-01-01T00:00:00Z+0000"), Ok(()));
        assert_eq!(signed("2999-01-01T00:00:00+0000"), Ok(()));
        assert_eq!(
            signed("2020-01-01T00:00:00Z+0000"),
            Err(AuthFailure::Expired)
        );
        assert_eq!(
            signed("2999-01-01T00:00:00ZZ"),
            Err(AuthFailure::BadExpires)
        );
    }

    #[test]
    fn known_vector() {
        // Computed independently (Python hmac/hashlib) over
        // "apikey=key&command=listzones&response=json" with secret "secret".
        let params = p(&[
            ("command", "listZones"),
            ("apiKey", "key"),
            ("response", "json"),
        ]);
        assert_eq!(
            compute_signature(&params, "secret"),
            "CB2VceYQ2lFqNkAe+39yeUIsH5w="
        );
    }
}
