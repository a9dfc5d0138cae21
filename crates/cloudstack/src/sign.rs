//! CloudStack request signing (HMAC-SHA1 over the sorted, lower-cased, Java-URLEncoded query).
//!
//! The management server rebuilds the string to sign from the parameters it received: every
//! parameter except `signature`, sorted by exact (case-sensitive) name, each written as
//! `name=value` with the value encoded the way Java's `URLEncoder` does (`+` replaced by `%20`),
//! joined with `&` and lower-cased as a whole. Anything we do differently is a 401.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

/// What Java's `URLEncoder` leaves alone: `A-Z a-z 0-9 . - * _`. Space is encoded as `%20`
/// rather than Java's `+`, which is what the server substitutes before signing.
const JAVA_URLENCODER: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'.')
    .remove(b'-')
    .remove(b'*')
    .remove(b'_');

/// Encodes `value` as Java's `URLEncoder` does, with space as `%20`.
pub fn encode_value(value: &str) -> String {
    utf8_percent_encode(value, JAVA_URLENCODER).to_string()
}

/// The exact string the server signs: params sorted by name, `name=encoded(value)`, joined by
/// `&`, lower-cased. `params` must already include `apiKey`, `command` and `response`.
pub fn string_to_sign(params: &[(String, String)]) -> String {
    let mut sorted: Vec<&(String, String)> = params.iter().collect();
    // Stable sort by exact name, like Java's natural String order for ASCII names.
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let joined = sorted
        .iter()
        .map(|(name, value)| format!("{name}={}", encode_value(value)))
        .collect::<Vec<_>>()
        .join("&");
    joined.to_lowercase()
}

/// Builds the signed query string for `params` (which must not contain `apiKey`, `signature`):
/// adds `apiKey`, sorts by name, signs, appends `signature`. Values are encoded as Java's
/// URLEncoder does with `+` as `%20`.
pub fn signed_query(params: &[(String, String)], api_key: &str, secret_key: &str) -> String {
    let mut all: Vec<(String, String)> = params
        .iter()
        .filter(|(name, _)| name != "apiKey" && name != "signature")
        .cloned()
        .collect();
    all.push(("apiKey".to_string(), api_key.to_string()));
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let sig = signature(&all, secret_key);
    let mut query = all
        .iter()
        .map(|(name, value)| format!("{}={}", encode_value(name), encode_value(value)))
        .collect::<Vec<_>>()
        .join("&");
    query.push_str("&signature=");
    query.push_str(&encode_value(&sig));
    query
}

/// Name and value of the parameter that asks for signature version 3 (`ApiServer.verifyRequest`
/// matches the name `signatureVersion` case-insensitively and compares the value with "3").
pub const SIGNATURE_VERSION: (&str, &str) = ("signatureversion", "3");

/// Name of the parameter that carries the expiry of a version-3 signature.
pub const EXPIRES: &str = "expires";

/// `unix_secs` as the `expires` of a version-3 signature: `yyyy-MM-dd'T'HH:mm:ss'Z'Z` in UTC,
/// e.g. `2022-04-18T06:21:58Z+0000`. `ApiServer.verifyRequest` reads `expires` with
/// `DateUtil.parseTZDateString`; older releases parse only that pattern (a literal `Z`, then
/// the offset), newer ones try ISO 8601 forms first and keep it as their last, "legacy" form,
/// so it is the one form every release accepts. Both `expires` and `signatureversion` are
/// signed like every other parameter: the server rebuilds the string to sign from all but
/// `signature`.
pub fn expires_value(unix_secs: u64) -> String {
    let stamp = super::types::cloudstack_date(unix_secs);
    // `cloudstack_date` writes `yyyy-MM-ddTHH:mm:ss+0000`; the literal `Z` goes before the offset.
    let (date_time, offset) = stamp.split_at(19);
    format!("{date_time}Z{offset}")
}

/// The signature alone (base64 of HMAC-SHA1 over the lower-cased sorted query), exposed for tests.
pub fn signature(params: &[(String, String)], secret_key: &str) -> String {
    // HMAC accepts keys of any length, so this cannot fail; fall back to an empty MAC input
    // rather than panicking if that ever changes.
    let Ok(mut mac) = Hmac::<sha1::Sha1>::new_from_slice(secret_key.as_bytes()) else {
        return String::new();
    };
    mac.update(string_to_sign(params).as_bytes());
    STANDARD.encode(mac.finalize().into_bytes())
}

/// Splits a raw query string into decoded `(name, value)` pairs the way a servlet container
/// does (`+` is a space, `%XX` is a byte, invalid UTF-8 replaced).
pub fn parse_query(raw_query: &str) -> Vec<(String, String)> {
    raw_query
        .split('&')
        .filter(|part| !part.is_empty())
        .map(|part| {
            let (name, value) = part.split_once('=').unwrap_or((part, ""));
            (decode_component(name), decode_component(value))
        })
        .collect()
}

fn decode_component(s: &str) -> String {
    let plus_as_space = s.replace('+', " ");
    percent_decode_str(&plus_as_space)
        .decode_utf8_lossy()
        .into_owned()
}

/// Checks a received query's `signature` against `secret_key` as the management server does.
/// False when the signature is missing or does not match.
pub fn verify_query(raw_query: &str, secret_key: &str) -> bool {
    let params = parse_query(raw_query);
    let mut received = None;
    let mut rest = Vec::with_capacity(params.len());
    for (name, value) in params {
        if name == "signature" {
            received = Some(value);
        } else {
            rest.push((name, value));
        }
    }
    let Some(received) = received else {
        return false;
    };
    let expected = signature(&rest, secret_key);
    constant_time_eq(expected.as_bytes(), received.as_bytes())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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

    const SECRET: &str =
        "VDaACYb0LV9eNjTetIOElcVQkvJck_J_QljX_FcHRj87ZKiy0z0ty0ZsYBkoXkY9b7eq1EhwJaw7FF3akA3KBQ";
    const API_KEY: &str =
        "plgWJfZK4gyS3mOMTVmjUVg-X-jlWlnfaUJ9GAbBbf9EdM-kAYMmAiLqzzq1ElZLYq_u38zCm0bewzGUdP66mg";

    fn vector_params() -> Vec<(String, String)> {
        p(&[
            ("command", "scaleKubernetesCluster"),
            ("response", "json"),
            ("id", "177d0eeb-ee9f-4bd6-b3b3-2e8e1bf4e1a4"),
            ("nodeids", "a1b2,c3d4"),
            ("name", "My Cluster~*.-_/+=é"),
        ])
    }

    /// Reference values computed independently with Python 3's standard library:
    ///
    /// ```python
    /// ALLOWED = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-*_")
    /// jenc = lambda s: "".join(chr(b) if b in ALLOWED else "%%%02X" % b for b in s.encode())
    /// s = "&".join(f"{k}={jenc(params[k])}" for k in sorted(params)).lower()
    /// base64.b64encode(hmac.new(secret.encode(), s.encode(), hashlib.sha1).digest())
    /// urllib.parse.quote(sig, safe="")
    /// ```
    ///
    /// with `params` = the pairs of `vector_params()` plus `apiKey`.
    #[test]
    fn signature_matches_independently_computed_value() {
        let mut params = vector_params();
        params.push(("apiKey".into(), API_KEY.into()));
        assert_eq!(
            string_to_sign(&params),
            "apikey=plgwjfzk4gys3momtvmjuvg-x-jlwlnfauj9gabbbf9edm-kaymmailqzzq1elzlyq_u38zcm0bewzgudp66mg\
             &command=scalekubernetescluster&id=177d0eeb-ee9f-4bd6-b3b3-2e8e1bf4e1a4\
             &name=my%20cluster%7e*.-_%2f%2b%3d%c3%a9&nodeids=a1b2%2cc3d4&response=json"
        );
        assert_eq!(signature(&params, SECRET), "69kyqKWpc0cz9lRS3rwUuqAXzBU=");
    }

    #[test]
    fn signed_query_appends_url_encoded_signature_and_api_key() {
        let query = signed_query(&vector_params(), API_KEY, SECRET);
        assert!(
            query.ends_with("&signature=69kyqKWpc0cz9lRS3rwUuqAXzBU%3D"),
            "{query}"
        );
        assert!(query.starts_with(&format!("apiKey={API_KEY}&command=scaleKubernetesCluster&")));
        assert!(
            query.contains("&name=My%20Cluster%7E*.-_%2F%2B%3D%C3%A9&"),
            "{query}"
        );
        assert!(verify_query(&query, SECRET));
    }

    #[test]
    fn sorting_is_by_exact_case_sensitive_name() {
        // `Zeta` sorts before `alpha` in Java's String order (uppercase first).
        let params = p(&[("alpha", "1"), ("Zeta", "2")]);
        assert_eq!(string_to_sign(&params), "zeta=2&alpha=1");
    }

    #[test]
    fn caller_supplied_api_key_and_signature_are_replaced() {
        let mut params = vector_params();
        params.push(("apiKey".into(), "other".into()));
        params.push(("signature".into(), "forged".into()));
        let query = signed_query(&params, API_KEY, SECRET);
        assert_eq!(query.matches("apiKey=").count(), 1);
        assert_eq!(query.matches("signature=").count(), 1);
        assert!(query.ends_with("69kyqKWpc0cz9lRS3rwUuqAXzBU%3D"));
    }

    #[test]
    fn verify_rejects_tampering_wrong_secret_and_missing_signature() {
        let query = signed_query(&vector_params(), API_KEY, SECRET);
        assert!(!verify_query(&query, "not-the-secret"));
        assert!(!verify_query(&query.replace("a1b2", "a1b3"), SECRET));
        let unsigned = query.split("&signature=").next().unwrap_or_default();
        assert!(!verify_query(unsigned, SECRET));
    }

    #[test]
    fn verify_accepts_plus_as_space_like_a_servlet() {
        let params = p(&[
            ("command", "listZones"),
            ("response", "json"),
            ("name", "a b"),
        ]);
        let query = signed_query(&params, "k", "s").replace("a%20b", "a+b");
        assert!(verify_query(&query, "s"));
    }

    #[test]
    fn expires_is_written_in_the_form_every_cloudstack_release_parses() {
        assert_eq!(expires_value(1_650_262_918), "2022-04-18T06:21:58Z+0000");
        assert_eq!(expires_value(0), "1970-01-01T00:00:00Z+0000");
    }

    #[test]
    fn encode_value_follows_java_urlencoder() {
        assert_eq!(encode_value("aZ09.-*_"), "aZ09.-*_");
        assert_eq!(encode_value(" ~!'()"), "%20%7E%21%27%28%29");
        assert_eq!(encode_value("é"), "%C3%A9");
    }
}
