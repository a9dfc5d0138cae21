//! CloudStack request signing (HMAC-SHA1 over the sorted, lower-cased, Java-URLEncoded query).

/// Builds the signed query string for `params` (which must not contain `apiKey`, `signature`):
/// adds `apiKey`, sorts by name, signs, appends `signature`. Values are encoded as Java's
/// URLEncoder does with `+` as `%20`.
pub fn signed_query(params: &[(String, String)], api_key: &str, secret_key: &str) -> String {
    todo!("client helper")
}

/// The signature alone (base64 of HMAC-SHA1 over the lower-cased sorted query), exposed for tests.
pub fn signature(params: &[(String, String)], secret_key: &str) -> String {
    todo!("client helper")
}

/// A key shown in logs: first 4 characters then `…`.
pub fn mask(key: &str) -> String {
    let head: String = key.chars().take(4).collect();
    format!("{head}…")
}
