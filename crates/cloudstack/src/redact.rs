//! How a credential is shown where it must be named at all (`Debug` output, logs): never
//! whole. Shared by the cloud-config and the CloudStack client, so it is a leaf that depends
//! on nothing else in the crate.

/// A key shown in logs: first 4 characters then `…`.
pub fn mask(key: &str) -> String {
    let head: String = key.chars().take(4).collect();
    format!("{head}…")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_keeps_only_a_short_prefix() {
        assert_eq!(
            mask("plgWJfZK4gyS3mOMTVmjUVg-X-jlWlnfaUJ9GAbBbf9EdM"),
            "plgW…"
        );
        assert_eq!(mask("ab"), "ab…");
        assert_eq!(mask("ééééé"), "éééé…", "characters, not bytes");
    }
}
