//! What a cloud-config means: `[Global]` and its keys as the in-tree provider's `CSConfig` takes
//! them from gcfg, checked into a [`CloudConfig`]. It owns the rules an operator's file is held
//! to (the required keys, the URL, the boolean, keys from elsewhere winning over the file's) so
//! that one file means the same to this provider and to the in-tree one, and it alone decides
//! what a warning or an error may quote: never a value but `api-url`'s and `ssl-no-verify`'s.

use super::ConfigError;
use super::gcfg::{CommentStart, Event, read_gcfg};
use crate::grammar::{BOOL_WORDS, parse_bool};
use std::fmt;
use std::path::Path;

/// The target of the warnings logged here: the `config` module's, whichever of its files
/// reads the cloud-config, so a log filter or reader finds them under one name.
const LOG_TARGET: &str = "cks_autoscaler_provider::config";

const SECTION: &str = "Global";

/// The string keys of `[Global]`, as the in-tree provider's `CSConfig` tags them.
const STRING_KEYS: [&str; 5] = ["api-url", "api-key", "secret-key", "project-id", "zone"];
const SSL_NO_VERIFY: &str = "ssl-no-verify";

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
            .field("api_key", &cks_cloudstack::redact::mask(&self.api_key))
            .field("secret_key", &"***")
            .field("ssl_no_verify", &self.ssl_no_verify)
            .field("project_id", &self.project_id)
            .field("zone", &self.zone)
            .finish()
    }
}

/// A parsed cloud-config and what the operator should hear about it.
#[derive(Debug)]
pub struct CloudConfigReport {
    pub config: CloudConfig,
    /// Each names the source, a line and a key or section; never a value.
    pub warnings: Vec<String>,
}

/// Parses cloud-config text; `source_name` (usually the path) names it in errors. `api-key` and
/// `secret-key` are required. Warnings are logged.
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
    let report = parse_cloud_config_report(text, source_name, api_key, secret_key)?;
    for warning in &report.warnings {
        tracing::warn!(target: LOG_TARGET, "{warning}");
    }
    Ok(report.config)
}

/// Like [`parse_cloud_config_with_keys`], returning the warnings instead of logging them.
pub fn parse_cloud_config_report(
    text: &str,
    source_name: &str,
    api_key: Option<String>,
    secret_key: Option<String>,
) -> Result<CloudConfigReport, ConfigError> {
    let mut global = GlobalSection::new(source_name);
    read_gcfg(text, source_name, &mut |event| global.apply(event))?;
    let GlobalSection {
        seen,
        strings,
        ssl_no_verify,
        warnings,
        ..
    } = global;
    if !seen {
        return Err(ConfigError::MissingSection {
            source_name: source_name.into(),
            section: SECTION.into(),
        });
    }
    let [api_url, file_api_key, file_secret_key, project_id, zone] = strings;
    let required = |key: &str, found: Option<Setting>| -> Result<Setting, ConfigError> {
        match found {
            Some(s) if !s.value.is_empty() => Ok(s),
            found => Err(ConfigError::MissingKey {
                source_name: source_name.into(),
                key: key.into(),
                hint: found.map(|s| s.empty_hint()).unwrap_or_default(),
            }),
        }
    };
    let from_elsewhere =
        |key: Option<String>| key.map(|k| k.trim().to_string()).filter(|k| !k.is_empty());

    let api_url = required("api-url", api_url)?;
    let url_problem = match url::Url::parse(&api_url.value) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => None,
        Ok(_) => Some(format!(
            "{:?} is not an http(s) URL with a host",
            api_url.value
        )),
        Err(e) => Some(format!("{:?} is not a URL ({e})", api_url.value)),
    };
    if let Some(reason) = url_problem {
        return Err(ConfigError::InvalidValue {
            source_name: source_name.into(),
            line: api_url.line,
            key: "api-url".into(),
            reason,
        });
    }
    let api_key = match from_elsewhere(api_key) {
        Some(k) => k,
        None => required("api-key", file_api_key)?.value,
    };
    let secret_key = match from_elsewhere(secret_key) {
        Some(k) => k,
        None => required("secret-key", file_secret_key)?.value,
    };
    let optional = |s: Option<Setting>| s.map(|s| s.value).filter(|v| !v.is_empty());
    Ok(CloudConfigReport {
        config: CloudConfig {
            api_url: api_url.value,
            api_key,
            secret_key,
            ssl_no_verify: ssl_no_verify.unwrap_or(false),
            project_id: optional(project_id),
            zone: optional(zone),
        },
        warnings,
    })
}

/// Reads the cloud-config at `path`, with keys from elsewhere taking precedence (see
/// [`parse_cloud_config_with_keys`]).
pub fn load_cloud_config_with_keys(
    path: &Path,
    api_key: Option<String>,
    secret_key: Option<String>,
) -> Result<CloudConfig, ConfigError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::Read {
        path: name.clone(),
        cause,
    })?;
    parse_cloud_config_with_keys(&text, &name, api_key, secret_key)
}

/// A string key's last value in `[Global]`, where it was, and how its line ended.
struct Setting {
    value: String,
    line: usize,
    comment: Option<CommentStart>,
}

impl Setting {
    /// Why an empty value came out empty, for [`ConfigError::MissingKey`].
    fn empty_hint(&self) -> String {
        match self.comment {
            Some(CommentStart { ch, .. }) => format!(
                " (line {}: the value starts with `{ch}`, which begins a comment; to use `{ch}` \
                 in a value, put the whole value in double quotes)",
                self.line
            ),
            None => format!(" (line {} sets it to an empty value)", self.line),
        }
    }
}

/// The in-tree provider's `CSConfig` as gcfg fills it: sections and names match without
/// regard to case, repeated `[Global]` sections add to one another, and the last value of a
/// key wins. Unlike gcfg, unknown sections and keys are skipped with a warning.
struct GlobalSection<'a> {
    source_name: &'a str,
    /// A plain `[Global]` header was seen.
    seen: bool,
    /// The variables that follow belong to `[Global]` (not a subsection of it).
    active: bool,
    strings: [Option<Setting>; 5],
    ssl_no_verify: Option<bool>,
    warnings: Vec<String>,
}

impl<'a> GlobalSection<'a> {
    fn new(source_name: &'a str) -> Self {
        Self {
            source_name,
            seen: false,
            active: false,
            strings: Default::default(),
            ssl_no_verify: None,
            warnings: Vec::new(),
        }
    }

    fn warn(&mut self, line: usize, what: String) {
        self.warnings.push(format!(
            "cloud-config {} line {line}: {what}",
            self.source_name
        ));
    }

    fn invalid(&self, line: usize, key: &str, reason: String) -> ConfigError {
        ConfigError::InvalidValue {
            source_name: self.source_name.into(),
            line,
            key: key.into(),
            reason,
        }
    }

    fn apply(&mut self, event: Event) -> Result<(), ConfigError> {
        match event {
            Event::Section {
                line,
                name,
                subsection,
            } => {
                let global = name.eq_ignore_ascii_case(SECTION);
                self.active = global && subsection.is_none();
                self.seen |= self.active;
                if global && subsection.is_some() {
                    self.warn(
                        line,
                        "a subsection of [Global] is not [Global]: its keys are ignored (gcfg \
                         refuses it); put the keys under a plain [Global] header"
                            .into(),
                    );
                } else if !global {
                    self.warn(
                        line,
                        format!(
                            "section [{name}] is ignored: this provider reads only [Global] \
                             (gcfg, as the in-tree provider calls it, refuses unknown sections)"
                        ),
                    );
                }
                Ok(())
            }
            Event::Variable {
                line,
                name,
                value,
                comment,
            } => {
                if !self.active {
                    return Ok(());
                }
                if name.eq_ignore_ascii_case(SSL_NO_VERIFY) {
                    // gcfg: a bare boolean name means true; an empty value is not a boolean.
                    let parsed = match &value {
                        None => true,
                        Some(v) => parse_bool(v).map_err(|_| {
                            self.invalid(
                                line,
                                SSL_NO_VERIFY,
                                format!("{v:?} is not one of {BOOL_WORDS}"),
                            )
                        })?,
                    };
                    self.ssl_no_verify = Some(parsed);
                    return Ok(());
                }
                let Some(slot) = STRING_KEYS
                    .iter()
                    .position(|k| name.eq_ignore_ascii_case(k))
                else {
                    let hint = suggest_key(&name)
                        .map(|k| format!(" (did you mean `{k}`?)"))
                        .unwrap_or_default();
                    self.warn(
                        line,
                        format!(
                            "unknown key in [Global] is ignored{hint}; gcfg, as the in-tree \
                             provider calls it, refuses unknown keys"
                        ),
                    );
                    return Ok(());
                };
                let key = STRING_KEYS[slot];
                let Some(value) = value else {
                    return Err(self.invalid(
                        line,
                        key,
                        "the name has no `= value`; gcfg reads a bare name as `true`, which only \
                         a true/false setting accepts"
                            .into(),
                    ));
                };
                if let Some(CommentStart { ch, glued: true }) = comment
                    && !value.is_empty()
                {
                    self.warn(
                        line,
                        format!(
                            "the value of `{key}` ends at an unquoted `{ch}` and the rest of the \
                             line is read as a comment (gcfg does the same); if the `{ch}` is \
                             part of the value, put the whole value in double quotes"
                        ),
                    );
                }
                self.strings[slot] = Some(Setting {
                    value,
                    line,
                    comment,
                });
                Ok(())
            }
        }
    }
}

/// The known key `name` probably meant: same letters, ignoring case and `-`.
fn suggest_key(name: &str) -> Option<&'static str> {
    let squash = |s: &str| -> String {
        s.chars()
            .filter(|c| *c != '-')
            .map(|c| c.to_ascii_lowercase())
            .collect()
    };
    let wanted = squash(name);
    STRING_KEYS
        .iter()
        .chain(std::iter::once(&SSL_NO_VERIFY))
        .find(|k| squash(k) == wanted)
        .copied()
}

#[cfg(test)]
mod tests;
