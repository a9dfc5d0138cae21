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
    let ini = Ini::load_from_str_opt(text, opt).map_err(|e| ConfigError::Syntax {
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
