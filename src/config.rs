//! Configuration sources: the CloudStack cloud-config (ini) and `--nodes` specs.
//!
//! The cloud-config is the file operators already have for the in-tree CloudStack provider and
//! CKS's `cloudstack-secret`: section `[Global]` with `api-url`, `api-key`, `secret-key` and
//! optionally `ssl-no-verify`, `project-id`, `zone`. Other keys are ignored. The `--nodes` spec
//! is the in-tree provider's `MIN:MAX:CLUSTER`.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use ini::{Ini, ParseOption};

/// Largest `MAX` accepted in a `--nodes` spec.
pub const MAX_NODES_LIMIT: u32 = 10_000;

const SECTION: &str = "Global";
const NODES_FORMAT: &str = "MIN:MAX:CLUSTER (e.g. 1:10:<cluster-uuid>, 1:10:name=my-cluster)";

/// Why a configuration source was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The cloud-config file could not be read.
    #[error("cannot read cloud-config {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The cloud-config is not valid ini.
    #[error("cloud-config {source_name} is not a valid ini file: {detail}")]
    Syntax { source_name: String, detail: String },
    /// No `[Global]` section.
    #[error("cloud-config {source_name} has no [{section}] section")]
    MissingSection {
        source_name: String,
        section: String,
    },
    /// A required key is absent or empty.
    #[error("cloud-config {source_name}: [Global] key `{key}` is missing or empty")]
    MissingKey { source_name: String, key: String },
    /// A key has a value this provider cannot use.
    #[error("cloud-config {source_name}: [Global] key `{key}` is invalid: {reason}")]
    InvalidValue {
        source_name: String,
        key: String,
        reason: String,
    },
    /// A `--nodes` spec could not be parsed.
    #[error("invalid --nodes value {input:?}: {reason}; expected {expected}")]
    NodesSpec {
        input: String,
        reason: String,
        expected: &'static str,
    },
}

/// CloudStack connection settings from the cloud-config.
#[derive(Clone, PartialEq)]
pub struct CloudConfig {
    /// e.g. `https://cloud.example.com/client/api`.
    pub api_url: String,
    pub api_key: String,
    pub secret_key: String,
    /// `ssl-no-verify = true`: skip TLS certificate checks.
    pub ssl_no_verify: bool,
    pub project_id: Option<String>,
    pub zone: Option<String>,
}

impl fmt::Debug for CloudConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CloudConfig")
            .field("api_url", &self.api_url)
            .field("api_key", &crate::cloudstack::sign::mask(&self.api_key))
            .field("secret_key", &"***")
            .field("ssl_no_verify", &self.ssl_no_verify)
            .field("project_id", &self.project_id)
            .field("zone", &self.zone)
            .finish()
    }
}

impl CloudConfig {
    /// Replaces the keys with ones read elsewhere (a file or an environment variable); `None`
    /// keeps the cloud-config's value. Empty overrides are ignored.
    pub fn with_overrides(mut self, api_key: Option<String>, secret_key: Option<String>) -> Self {
        if let Some(key) = api_key
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty())
        {
            self.api_key = key;
        }
        if let Some(secret) = secret_key
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
        {
            self.secret_key = secret;
        }
        self
    }

    /// The client settings for these credentials (no extra CA bundle; set
    /// `ca_bundle_pem` on the result to add one).
    pub fn client_config(&self, request_timeout: Duration) -> crate::cloudstack::ClientConfig {
        crate::cloudstack::ClientConfig {
            api_url: self.api_url.clone(),
            api_key: self.api_key.clone(),
            secret_key: self.secret_key.clone(),
            ssl_no_verify: self.ssl_no_verify,
            ca_bundle_pem: None,
            project_id: self.project_id.clone(),
            request_timeout,
        }
    }
}

/// Parses cloud-config text; `source_name` (usually the path) names it in errors. `api-key` and
/// `secret-key` are required.
pub fn parse_cloud_config(text: &str, source_name: &str) -> Result<CloudConfig, ConfigError> {
    parse_cloud_config_with_keys(text, source_name, None, None)
}

/// Like [`parse_cloud_config`], but with keys supplied from elsewhere taking precedence; the
/// cloud-config may then omit `api-key`/`secret-key`.
pub fn parse_cloud_config_with_keys(
    text: &str,
    source_name: &str,
    api_key: Option<String>,
    secret_key: Option<String>,
) -> Result<CloudConfig, ConfigError> {
    // Escapes off: secrets may contain backslashes, which must reach the signer untouched.
    let opt = ParseOption {
        enabled_quote: false,
        enabled_escape: false,
        ..ParseOption::default()
    };
    // rust-ini treats backslash-newline as a line continuation even with escapes off, which
    // would glue the next line onto a secret ending in `\`. A space after the backslash stops
    // that and is trimmed from the value.
    let text = text.replace("\\\n", "\\ \n");
    let ini = Ini::load_from_str_opt(&text, opt).map_err(|e| ConfigError::Syntax {
        source_name: source_name.into(),
        detail: e.to_string(),
    })?;
    let global = ini
        .iter()
        .filter(|(name, _)| name.is_some_and(|n| n.trim().eq_ignore_ascii_case(SECTION)))
        .map(|(_, props)| props)
        .next_back()
        .ok_or_else(|| ConfigError::MissingSection {
            source_name: source_name.into(),
            section: SECTION.into(),
        })?;
    // gcfg (which the Go providers use) matches names case-insensitively; so do we. Later keys win.
    let get = |key: &str| -> Option<String> {
        global
            .iter()
            .filter(|(k, _)| k.trim().eq_ignore_ascii_case(key))
            .map(|(_, v)| unquote(v.trim()).to_string())
            .next_back()
            .filter(|v| !v.is_empty())
    };
    let missing = |key: &str| ConfigError::MissingKey {
        source_name: source_name.into(),
        key: key.into(),
    };
    let invalid = |key: &str, reason: String| ConfigError::InvalidValue {
        source_name: source_name.into(),
        key: key.into(),
        reason,
    };

    let api_url = get("api-url").ok_or_else(|| missing("api-url"))?;
    match url::Url::parse(&api_url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => {}
        Ok(_) => {
            return Err(invalid(
                "api-url",
                format!("{api_url:?} is not an http(s) URL with a host"),
            ));
        }
        Err(e) => {
            return Err(invalid(
                "api-url",
                format!("{api_url:?} is not a URL ({e})"),
            ));
        }
    }
    let api_key = api_key
        .map(|k| k.trim().to_string())
        .filter(|k| !k.is_empty())
        .or_else(|| get("api-key"))
        .ok_or_else(|| missing("api-key"))?;
    let secret_key = secret_key
        .map(|k| k.trim().to_string())
        .filter(|k| !k.is_empty())
        .or_else(|| get("secret-key"))
        .ok_or_else(|| missing("secret-key"))?;
    let ssl_no_verify = match get("ssl-no-verify") {
        None => false,
        Some(v) => parse_bool(&v)
            .ok_or_else(|| invalid("ssl-no-verify", format!("{v:?} is not true or false")))?,
    };
    Ok(CloudConfig {
        api_url,
        api_key,
        secret_key,
        ssl_no_verify,
        project_id: get("project-id"),
        zone: get("zone"),
    })
}

/// Reads and parses the cloud-config at `path`.
pub fn load_cloud_config(path: &Path) -> Result<CloudConfig, ConfigError> {
    load_cloud_config_with_keys(path, None, None)
}

/// Reads the cloud-config at `path`, with keys from elsewhere taking precedence (see
/// [`parse_cloud_config_with_keys`]).
pub fn load_cloud_config_with_keys(
    path: &Path,
    api_key: Option<String>,
    secret_key: Option<String>,
) -> Result<CloudConfig, ConfigError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: name.clone(),
        source,
    })?;
    parse_cloud_config_with_keys(&text, &name, api_key, secret_key)
}

/// gcfg accepts `"quoted"` values; strip one pair of surrounding double quotes, nothing else.
fn unquote(v: &str) -> &str {
    v.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(v)
}

/// Booleans as gcfg reads them.
fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Some(true),
        "false" | "no" | "off" | "0" => Some(false),
        _ => None,
    }
}

/// How a `--nodes` spec names its CKS cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClusterRef {
    /// A cluster UUID.
    Id(String),
    /// A cluster name (exact match).
    Name(String),
}

impl fmt::Display for ClusterRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterRef::Id(id) => write!(f, "id={id}"),
            ClusterRef::Name(name) => write!(f, "name={name}"),
        }
    }
}

/// One `--nodes MIN:MAX:CLUSTER` node group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGroupSpec {
    pub min: u32,
    pub max: u32,
    pub cluster: ClusterRef,
}

/// Parses `MIN:MAX:CLUSTER`. CLUSTER is an id when UUID-shaped, else a name; `id=…`/`name=…`
/// say which explicitly.
pub fn parse_nodes_spec(s: &str) -> Result<NodeGroupSpec, ConfigError> {
    let err = |reason: String| ConfigError::NodesSpec {
        input: s.to_string(),
        reason,
        expected: NODES_FORMAT,
    };
    let parts: Vec<&str> = s.trim().split(':').collect();
    let [min, max, cluster] = parts.as_slice() else {
        return Err(err(format!(
            "has {} colon-separated part(s), not 3",
            parts.len()
        )));
    };
    let number = |what: &str, v: &str| -> Result<u32, ConfigError> {
        v.trim().parse::<u32>().map_err(|_| {
            err(format!(
                "{what} {:?} is not a non-negative whole number",
                v.trim()
            ))
        })
    };
    let min = number("MIN", min)?;
    let max = number("MAX", max)?;
    if min > max {
        return Err(err(format!("MIN {min} is greater than MAX {max}")));
    }
    if max > MAX_NODES_LIMIT {
        return Err(err(format!(
            "MAX {max} exceeds the limit of {MAX_NODES_LIMIT}"
        )));
    }
    let cluster = cluster.trim();
    let cluster = if let Some(id) = cluster.strip_prefix("id=") {
        ClusterRef::Id(id.trim().to_string())
    } else if let Some(name) = cluster.strip_prefix("name=") {
        ClusterRef::Name(name.trim().to_string())
    } else if is_uuid(cluster) {
        ClusterRef::Id(cluster.to_string())
    } else {
        ClusterRef::Name(cluster.to_string())
    };
    let (ClusterRef::Id(v) | ClusterRef::Name(v)) = &cluster;
    if v.is_empty() {
        return Err(err("CLUSTER is empty".into()));
    }
    Ok(NodeGroupSpec { min, max, cluster })
}

/// 8-4-4-4-12 hex digits.
fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.chars().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const URL: &str = "https://cloud.example.com/client/api";

    fn ok(text: &str) -> CloudConfig {
        parse_cloud_config(text, "cloud-config").unwrap_or_else(|e| panic!("{e}\n---\n{text}"))
    }

    #[test]
    fn cloud_config_accepts_what_operators_have() {
        struct Case {
            name: &'static str,
            text: &'static str,
            key: &'static str,
            secret: &'static str,
            ssl_no_verify: bool,
            project: Option<&'static str>,
            zone: Option<&'static str>,
        }
        let cases = [
            Case {
                name: "minimal",
                text: "[Global]\napi-url = https://cloud.example.com/client/api\napi-key = AK\nsecret-key = SK\n",
                key: "AK",
                secret: "SK",
                ssl_no_verify: false,
                project: None,
                zone: None,
            },
            Case {
                name: "all keys, CRLF, comments, unknown keys and sections",
                text: "; written by deploy-cloudstack-secret\r\n# another comment\r\n[Global]\r\n\
                       api-url=https://cloud.example.com/client/api\r\napi-key=AK\r\nsecret-key=SK\r\n\
                       ssl-no-verify=true\r\nproject-id=p-1\r\nzone=zone1\r\nregion=r1\r\n\
                       [LoadBalancer]\r\nfoo=bar\r\n",
                key: "AK",
                secret: "SK",
                ssl_no_verify: true,
                project: Some("p-1"),
                zone: Some("zone1"),
            },
            Case {
                name: "secrets with = and backslashes stay verbatim",
                text: "[Global]\napi-url = https://cloud.example.com/client/api\n\
                       api-key = ab=cd==\nsecret-key = s\\e\\\\cr=et\\n\n",
                key: "ab=cd==",
                secret: "s\\e\\\\cr=et\\n",
                ssl_no_verify: false,
                project: None,
                zone: None,
            },
            Case {
                name: "trailing backslash and comment characters inside a secret",
                text: "[Global]\napi-url = https://cloud.example.com/client/api\napi-key = a;b#c\nsecret-key = abc\\\nzone = z\n",
                key: "a;b#c",
                secret: "abc\\",
                ssl_no_verify: false,
                project: None,
                zone: Some("z"),
            },
            Case {
                name: "quoted values and case-insensitive names (gcfg compatible)",
                text: "[global]\nAPI-URL = \"https://cloud.example.com/client/api\"\nApi-Key = \"AK\"\n\
                       secret-key = \"S K\"\nssl-no-verify = FALSE\nproject-id =\n",
                key: "AK",
                secret: "S K",
                ssl_no_verify: false,
                project: None,
                zone: None,
            },
        ];
        for case in cases {
            let cfg = ok(case.text);
            assert_eq!(cfg.api_url, URL, "{}", case.name);
            assert_eq!(cfg.api_key, case.key, "{}", case.name);
            assert_eq!(cfg.secret_key, case.secret, "{}", case.name);
            assert_eq!(cfg.ssl_no_verify, case.ssl_no_verify, "{}", case.name);
            assert_eq!(cfg.project_id.as_deref(), case.project, "{}", case.name);
            assert_eq!(cfg.zone.as_deref(), case.zone, "{}", case.name);
        }
    }

    #[test]
    fn cloud_config_errors_name_the_source_and_the_key() {
        let cases: [(&str, &str, &[&str]); 7] = [
            ("api-url = x\n", "no section", &["my.ini", "[Global]"]),
            (
                "[Other]\napi-url = https://a/\n",
                "wrong section",
                &["my.ini", "[Global]"],
            ),
            (
                "[Global]\napi-key = a\nsecret-key = b\n",
                "no url",
                &["my.ini", "`api-url`", "missing"],
            ),
            (
                "[Global]\napi-url = https://a/\nsecret-key = b\n",
                "no key",
                &["my.ini", "`api-key`"],
            ),
            (
                "[Global]\napi-url = https://a/\napi-key = a\nsecret-key =\n",
                "empty secret",
                &["`secret-key`"],
            ),
            (
                "[Global]\napi-url = https://a/\napi-key = a\nsecret-key = b\nssl-no-verify = maybe\n",
                "bad bool",
                &["`ssl-no-verify`", "maybe"],
            ),
            (
                "[Global]\napi-url = cloud.example.com\napi-key = a\nsecret-key = b\n",
                "bad url",
                &["`api-url`", "invalid"],
            ),
        ];
        for (text, name, needles) in cases {
            let err = parse_cloud_config(text, "my.ini")
                .expect_err(name)
                .to_string();
            for needle in needles {
                assert!(err.contains(needle), "{name}: {err:?} lacks {needle:?}");
            }
        }
    }

    #[test]
    fn invalid_value_errors_never_quote_secrets() {
        let err = parse_cloud_config(
            "[Global]\napi-url = ftp://x/\napi-key = AKEY\nsecret-key = SKEY\n",
            "f",
        )
        .unwrap_err()
        .to_string();
        assert!(!err.contains("SKEY") && !err.contains("AKEY"), "{err}");
    }

    #[test]
    fn keys_from_elsewhere_override_or_fill_in() {
        let text = "[Global]\napi-url = https://cloud.example.com/client/api\n";
        assert!(matches!(
            parse_cloud_config(text, "f"),
            Err(ConfigError::MissingKey { key, .. }) if key == "api-key"
        ));
        let cfg = parse_cloud_config_with_keys(text, "f", Some("AK\n".into()), Some("SK".into()))
            .unwrap();
        assert_eq!(
            (cfg.api_key.as_str(), cfg.secret_key.as_str()),
            ("AK", "SK")
        );

        let cfg = ok(
            "[Global]\napi-url = https://cloud.example.com/client/api\napi-key = A\nsecret-key = S\n",
        );
        let replaced = cfg.clone().with_overrides(None, Some("S2\n".into()));
        assert_eq!(
            (replaced.api_key.as_str(), replaced.secret_key.as_str()),
            ("A", "S2")
        );
        assert_eq!(cfg.clone().with_overrides(Some(String::new()), None), cfg);
    }

    #[test]
    fn debug_masks_secrets_and_client_config_carries_settings() {
        let cfg = ok(
            "[Global]\napi-url = https://cloud.example.com/client/api\napi-key = APIKEY123\n\
                      secret-key = TOPSECRET\nssl-no-verify = true\nproject-id = p\n",
        );
        let shown = format!("{cfg:?}");
        assert!(
            !shown.contains("TOPSECRET") && !shown.contains("APIKEY123"),
            "{shown}"
        );
        let client = cfg.client_config(Duration::from_secs(7));
        assert_eq!(client.api_url, URL);
        assert_eq!(
            (client.api_key.as_str(), client.secret_key.as_str()),
            ("APIKEY123", "TOPSECRET")
        );
        assert!(client.ssl_no_verify);
        assert_eq!(client.project_id.as_deref(), Some("p"));
        assert_eq!(client.request_timeout, Duration::from_secs(7));
        assert!(client.ca_bundle_pem.is_none());
    }

    #[test]
    fn load_reads_a_file_and_names_it_in_errors() {
        let dir = std::env::temp_dir().join(format!("cks-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cloud-config");
        std::fs::write(
            &path,
            "[Global]\napi-url = https://cloud.example.com/client/api\napi-key = A\n",
        )
        .unwrap();
        let err = load_cloud_config(&path).unwrap_err().to_string();
        assert!(
            err.contains(&path.display().to_string()) && err.contains("`secret-key`"),
            "{err}"
        );
        let cfg = load_cloud_config_with_keys(&path, None, Some("S".into())).unwrap();
        assert_eq!(cfg.secret_key, "S");
        let missing = dir.join("absent");
        let err = load_cloud_config(&missing).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Read { path, .. } if path.ends_with("absent")),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    const UUID: &str = "177d0eeb-ee9f-4bd6-b3b3-2e8e1bf4e1a4";

    #[test]
    fn nodes_spec_accepts_ids_and_names() {
        let cases: [(&str, u32, u32, ClusterRef); 7] = [
            (
                "1:5:177d0eeb-ee9f-4bd6-b3b3-2e8e1bf4e1a4",
                1,
                5,
                ClusterRef::Id(UUID.into()),
            ),
            (
                "0:10:177D0EEB-EE9F-4BD6-B3B3-2E8E1BF4E1A4",
                0,
                10,
                ClusterRef::Id(UUID.to_uppercase()),
            ),
            ("2:2:prod", 2, 2, ClusterRef::Name("prod".into())),
            (" 1 : 3 : prod ", 1, 3, ClusterRef::Name("prod".into())),
            (
                "1:3:name=177d0eeb-ee9f-4bd6-b3b3-2e8e1bf4e1a4",
                1,
                3,
                ClusterRef::Name(UUID.into()),
            ),
            ("1:3:id=legacy-id", 1, 3, ClusterRef::Id("legacy-id".into())),
            (
                "0:10000:177d0eeb-ee9f-4bd6-b3b3-2e8e1bf4e1a",
                0,
                10_000,
                ClusterRef::Name(UUID[..35].into()),
            ),
        ];
        for (input, min, max, cluster) in cases {
            let spec = parse_nodes_spec(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(spec, NodeGroupSpec { min, max, cluster }, "{input}");
        }
    }

    #[test]
    fn nodes_spec_errors_quote_the_input_and_the_format() {
        let cases: [(&str, &str); 10] = [
            ("1:5", "2 colon-separated part(s)"),
            ("1:5:a:b", "4 colon-separated part(s)"),
            ("", "1 colon-separated part(s)"),
            ("x:5:prod", "MIN \"x\""),
            ("1:-5:prod", "MAX \"-5\""),
            ("1:2.5:prod", "MAX \"2.5\""),
            ("6:5:prod", "MIN 6 is greater than MAX 5"),
            ("1:10001:prod", "exceeds the limit of 10000"),
            ("1:5:", "CLUSTER is empty"),
            ("1:5:id=", "CLUSTER is empty"),
        ];
        for (input, reason) in cases {
            let err = parse_nodes_spec(input).expect_err(input).to_string();
            assert!(err.contains(&format!("{input:?}")), "{err}");
            assert!(err.contains(reason), "{input}: {err}");
            assert!(err.contains("MIN:MAX:CLUSTER"), "{err}");
        }
    }
}
