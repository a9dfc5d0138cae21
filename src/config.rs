//! Configuration sources: the CloudStack cloud-config (ini) and `--nodes` specs.
//!
//! The cloud-config is the file operators already have for the in-tree CloudStack provider and
//! CKS's `cloudstack-secret`: section `[Global]` with `api-url`, `api-key`, `secret-key` and
//! optionally `ssl-no-verify`, `project-id`, `zone`. This module reads it the way gcfg
//! (`gopkg.in/gcfg.v1`, which the in-tree provider calls) does, so one file means the same to
//! both. The rules, and the one place this reader is more lenient (unknown keys and sections are
//! ignored with a warning instead of refused), are in docs/operations.md §2.5. The `--nodes`
//! spec is the in-tree provider's `MIN:MAX:CLUSTER`, optionally bound to the one autoscaler it
//! is served to (`MIN:MAX:CLUSTER@CLIENT`, see [`parse_nodes`] and [`check_client_binding`]).
//!
//! Nothing here logs or returns a value read from the file except `api-url` and
//! `ssl-no-verify`: errors and warnings name lines, columns, keys and sections.

use crate::grammar::{BOOL_WORDS, parse_bool};
use std::fmt;
use std::path::Path;

/// Largest `MAX` accepted in a `--nodes` spec.
pub const MAX_NODES_LIMIT: u32 = 10_000;

const SECTION: &str = "Global";
const NODES_FORMAT: &str = "MIN:MAX:CLUSTER or MIN:MAX:CLUSTER@CLIENT (e.g. 1:10:<cluster-uuid>, \
     1:10:name=my-cluster@autoscaler.my-cluster)";

/// The string keys of `[Global]`, as the in-tree provider's `CSConfig` tags them.
const STRING_KEYS: [&str; 5] = ["api-url", "api-key", "secret-key", "project-id", "zone"];
const SSL_NO_VERIFY: &str = "ssl-no-verify";

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
    /// The cloud-config breaks gcfg's syntax at `line`. `detail` never quotes file content.
    #[error("cloud-config {source_name} line {line}: {detail}")]
    Syntax {
        source_name: String,
        line: usize,
        detail: String,
    },
    /// No `[Global]` section.
    #[error("cloud-config {source_name} has no [{section}] section")]
    MissingSection {
        source_name: String,
        section: String,
    },
    /// A required key is absent or empty; `hint` says why it came out empty, when known.
    #[error("cloud-config {source_name}: [Global] key `{key}` is missing or empty{hint}")]
    MissingKey {
        source_name: String,
        key: String,
        hint: String,
    },
    /// A key on `line` has a value this provider (or gcfg) cannot use.
    #[error("cloud-config {source_name} line {line}: [Global] key `{key}` is invalid: {reason}")]
    InvalidValue {
        source_name: String,
        line: usize,
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
    /// The node groups and the TLS settings together would let one autoscaler see or change
    /// another's groups. `missing` says what to add, each item a sentence.
    #[error(
        "client binding: {}. Each autoscaler must see only its own cluster's node group: one \
         that saw another cluster's group would take that cluster's workers for its own \
         unregistered nodes and delete them after max-node-provision-time, and scale that \
         cluster for its own pods",
        missing.join("; ")
    )]
    ClientBinding { missing: Vec<String> },
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
        tracing::warn!("{warning}");
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
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: name.clone(),
        source,
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

/// The unquoted `;` or `#` that ended a value; `glued` when it came right after value text
/// (`abc;def`), which looks like part of the value rather than a comment.
#[derive(Clone, Copy)]
struct CommentStart {
    ch: char,
    glued: bool,
}

/// What the gcfg reader hands over, in file order: a section header or a variable.
enum Event {
    Section {
        line: usize,
        name: String,
        subsection: Option<String>,
    },
    Variable {
        line: usize,
        name: String,
        /// `None` for a bare `name` without `=` (gcfg's "blank" value).
        value: Option<String>,
        comment: Option<CommentStart>,
    },
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

/// gcfg's first character of a name: a letter (ASCII or Unicode).
fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || (!c.is_ascii() && c.is_alphabetic())
}

/// gcfg's later characters of a name: letters, digits and `-`.
fn is_name_char(c: char) -> bool {
    is_name_start(c) || c.is_ascii_digit() || c == '-' || (!c.is_ascii() && c.is_numeric())
}

/// gcfg skips these between tokens and trims them from the end of an unquoted value.
fn is_blank(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r')
}

const UNTERMINATED: &str =
    "a double-quoted value has no closing `\"` on its line (a quoted value cannot span lines)";

/// Reads `text` with gcfg's syntax, handing each section header and variable to `on` in file
/// order. The first error, from the syntax or from `on`, ends the read.
fn read_gcfg(
    text: &str,
    source_name: &str,
    on: &mut dyn FnMut(Event) -> Result<(), ConfigError>,
) -> Result<(), ConfigError> {
    // gcfg refuses NUL anywhere; say so before a NUL inside a value confuses anything else.
    if let Some(at) = text.find('\0') {
        return Err(ConfigError::Syntax {
            source_name: source_name.into(),
            line: text[..at].matches('\n').count() + 1,
            detail: "the file holds a NUL character, which gcfg refuses".into(),
        });
    }
    // Editors such as Notepad start UTF-8 files with a byte-order mark; it cannot belong to a
    // name or a value, so it is skipped.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    Reader {
        chars: text.chars().peekable(),
        line: 1,
        column: 1,
        source_name,
    }
    .read(on)
}

struct Reader<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    line: usize,
    /// 1-based column of the next character.
    column: usize,
    source_name: &'a str,
}

impl Reader<'_> {
    fn peek(&mut self) -> Option<char> {
        self.chars.peek().copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.next()?;
        if c == '\n' {
            self.line += 1;
            self.column = 1;
        } else {
            self.column += 1;
        }
        Some(c)
    }

    fn skip_blanks(&mut self) {
        while self.peek().is_some_and(is_blank) {
            self.bump();
        }
    }

    fn skip_comment(&mut self) {
        while !matches!(self.peek(), None | Some('\n')) {
            self.bump();
        }
    }

    fn error(&self, line: usize, detail: impl Into<String>) -> ConfigError {
        ConfigError::Syntax {
            source_name: self.source_name.into(),
            line,
            detail: detail.into(),
        }
    }

    /// An error about the next character, by column: the character itself may be a secret's.
    fn error_here(&self, detail: &str) -> ConfigError {
        self.error(self.line, format!("column {}: {detail}", self.column))
    }

    /// The error for a character that cannot continue a name; `_` gets a hint because the
    /// keys are spelled with `-`.
    fn bad_name_char(&mut self, detail: &str) -> ConfigError {
        if self.peek() == Some('_') {
            self.error_here(&format!(
                "{detail}; `_` is not allowed in a name (the keys are spelled with `-`, \
                 e.g. `secret-key`)"
            ))
        } else {
            self.error_here(detail)
        }
    }

    fn name(&mut self) -> String {
        let mut name = String::new();
        while let Some(c) = self.peek().filter(|c| is_name_char(*c)) {
            name.push(c);
            self.bump();
        }
        name
    }

    fn read(
        mut self,
        on: &mut dyn FnMut(Event) -> Result<(), ConfigError>,
    ) -> Result<(), ConfigError> {
        let mut in_section = false;
        loop {
            self.skip_blanks();
            match self.peek() {
                None => return Ok(()),
                Some('\n') => {
                    self.bump();
                }
                Some(';' | '#') => self.skip_comment(),
                Some('[') => {
                    on(self.header()?)?;
                    in_section = true;
                }
                Some(c) if is_name_start(c) => {
                    if !in_section {
                        return Err(self.error(
                            self.line,
                            "a `name = value` line comes before any section header; the keys \
                             belong under a [Global] header",
                        ));
                    }
                    on(self.variable()?)?;
                }
                Some(_) => {
                    return Err(self.error_here(
                        "expected a [section] header, a `name = value` line or a comment \
                         (a name starts with a letter)",
                    ));
                }
            }
        }
    }

    fn header(&mut self) -> Result<Event, ConfigError> {
        let line = self.line;
        self.bump(); // `[`
        self.skip_blanks();
        if !self.peek().is_some_and(is_name_start) {
            return Err(self.error_here(
                "expected a section name after `[` (letters, digits and `-`, starting with a \
                 letter)",
            ));
        }
        let name = self.name();
        self.skip_blanks();
        let mut subsection = None;
        if self.peek() == Some('"') {
            self.bump();
            let sub = self.subsection_name(line)?;
            if sub.is_empty() {
                return Err(self.error(
                    line,
                    "empty subsection name `\"\"`; write [name] for a section without one",
                ));
            }
            subsection = Some(sub);
            self.skip_blanks();
        }
        if self.peek() != Some(']') {
            return Err(self.bad_name_char("expected `]` to close the section header"));
        }
        self.bump();
        self.skip_blanks();
        if !matches!(self.peek(), None | Some('\n' | ';' | '#')) {
            return Err(self.error_here(
                "unexpected text after the section header; only a comment may follow it",
            ));
        }
        Ok(Event::Section {
            line,
            name,
            subsection,
        })
    }

    /// The rest of `"name"` in `[section "name"]`: only `\\` and `\"` are escapes there.
    fn subsection_name(&mut self, line: usize) -> Result<String, ConfigError> {
        let mut name = String::new();
        loop {
            match self.bump() {
                None | Some('\n') => {
                    return Err(self.error(line, "the subsection name has no closing `\"`"));
                }
                Some('"') => return Ok(name),
                Some('\\') => match self.bump() {
                    Some(c @ ('\\' | '"')) => name.push(c),
                    _ => {
                        return Err(self.error(
                            line,
                            "a subsection name allows only the escapes `\\\\` and `\\\"`",
                        ));
                    }
                },
                Some(c) => name.push(c),
            }
        }
    }

    fn variable(&mut self) -> Result<Event, ConfigError> {
        let line = self.line;
        let name = self.name();
        self.skip_blanks();
        match self.peek() {
            None | Some('\n' | ';' | '#') => {
                if self.peek().is_some_and(|c| c != '\n') {
                    self.skip_comment();
                }
                return Ok(Event::Variable {
                    line,
                    name,
                    value: None,
                    comment: None,
                });
            }
            Some('=') => {
                self.bump();
            }
            Some(_) => {
                return Err(self.bad_name_char(
                    "expected `=` after the name (a name holds letters, digits and `-`)",
                ));
            }
        }
        self.skip_blanks();
        let (value, comment) = self.value(line)?;
        if comment.is_some() {
            self.skip_comment();
        }
        Ok(Event::Variable {
            line,
            name,
            value: Some(value),
            comment,
        })
    }

    /// A value after `=` and the blanks after it, as gcfg's scanner and `unquote` read it:
    /// it ends at the end of the line or at an unquoted `;`/`#`; blanks at its end are dropped
    /// unless quoted; `"` toggles quoting anywhere in it; inside quotes `\\ \" \n \t` are the
    /// escapes; outside them `\` must come before `"` or end the line (a continuation that
    /// joins the next line with nothing in between); carriage returns are dropped.
    fn value(&mut self, line: usize) -> Result<(String, Option<CommentStart>), ConfigError> {
        let mut value = String::new();
        // `value`'s length up to its last character that is not a trailing unquoted blank.
        let mut kept = 0;
        let mut quoted = false;
        let mut after_blank = true;
        let comment = loop {
            let c = match self.peek() {
                None | Some('\n') if quoted => return Err(self.error(line, UNTERMINATED)),
                None | Some('\n') => break None,
                Some(ch @ (';' | '#')) if !quoted => {
                    break Some(CommentStart {
                        ch,
                        glued: !after_blank,
                    });
                }
                Some(c) => c,
            };
            self.bump();
            match c {
                '\\' if quoted => {
                    let at = self.line;
                    match self.bump() {
                        Some('\\') => value.push('\\'),
                        Some('"') => value.push('"'),
                        Some('n') => value.push('\n'),
                        Some('t') => value.push('\t'),
                        _ => {
                            return Err(self.error(
                                at,
                                "unknown escape inside double quotes: only `\\\\`, `\\\"`, \
                                 `\\n` and `\\t` are escapes (write `\\\\` for a backslash)",
                            ));
                        }
                    }
                }
                '\\' => {
                    if self.peek() == Some('\r') {
                        self.bump();
                    }
                    match self.peek() {
                        Some('\n') => {
                            self.bump();
                        }
                        Some('"') => {
                            self.bump();
                            value.push('"');
                        }
                        _ => {
                            return Err(self.error(
                                self.line,
                                "a `\\` outside double quotes must end the line (a line \
                                 continuation) or come before `\"`; to keep a backslash in a \
                                 value, put the whole value in double quotes and write `\\\\`",
                            ));
                        }
                    }
                }
                '"' => quoted = !quoted,
                '\r' => {}
                c => value.push(c),
            }
            after_blank = !quoted && is_blank(c);
            if !after_blank {
                kept = value.len();
            }
        };
        value.truncate(kept);
        Ok((value, comment))
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

/// One `--nodes MIN:MAX:CLUSTER[@CLIENT]` value: a node group and the autoscaler it is served
/// to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundNodeGroup {
    pub group: NodeGroupSpec,
    /// The client the group is served to, matched against the DNS SANs of the caller's
    /// verified client certificate (its CN when it has no DNS SAN). `None`: every client.
    pub client: Option<String>,
}

/// Parses `MIN:MAX:CLUSTER` with no client bound (see [`parse_nodes`] for the whole syntax):
/// a value binding a client is refused rather than read without its client.
pub fn parse_nodes_spec(s: &str) -> Result<NodeGroupSpec, ConfigError> {
    let bound = parse_nodes(s)?;
    match bound.client {
        None => Ok(bound.group),
        Some(client) => Err(nodes_error(
            s,
            format!("binds client {client:?}, which this reader of MIN:MAX:CLUSTER would drop"),
        )),
    }
}

fn nodes_error(input: &str, reason: String) -> ConfigError {
    ConfigError::NodesSpec {
        input: input.to_string(),
        reason,
        expected: NODES_FORMAT,
    }
}

/// Parses `MIN:MAX:CLUSTER[@CLIENT]`. CLUSTER is an id when UUID-shaped, else a name;
/// `id=…`/`name=…` say which explicitly. The first `@` starts CLIENT, so a cluster whose name
/// holds an `@` is named by id. CLIENT is a DNS name or a certificate CN: no `*` (wildcards are
/// never matched), no control characters, no surrounding spaces.
pub fn parse_nodes(s: &str) -> Result<BoundNodeGroup, ConfigError> {
    let err = |reason: String| nodes_error(s, reason);
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
    let (cluster, client) = match cluster.split_once('@') {
        Some((cluster, client)) => (cluster, Some(parse_client(client).map_err(err)?)),
        None => (*cluster, None),
    };
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
    Ok(BoundNodeGroup {
        group: NodeGroupSpec { min, max, cluster },
        client,
    })
}

/// The CLIENT of `CLUSTER@CLIENT`, trimmed.
fn parse_client(client: &str) -> Result<String, String> {
    let client = client.trim();
    if client.is_empty() {
        return Err("CLIENT after `@` is empty".into());
    }
    if client.contains('*') {
        return Err(format!(
            "CLIENT {client:?} holds a `*`: wildcard certificate names are never matched; name \
             the one DNS SAN (or CN) of the autoscaler's certificate"
        ));
    }
    if client.chars().any(char::is_control) {
        return Err(format!("CLIENT {client:?} holds a control character"));
    }
    Ok(client.to_string())
}

/// Refuses node groups and TLS settings that would let an autoscaler see or change another's
/// groups: with more than one group, every group must name its client and client
/// certificates must be required (`client_ca`, `--tls-client-ca`); a group naming a client
/// needs them too, or no caller could ever be told to be that client. One group served to
/// every client (the in-tree provider's setup) needs nothing.
pub fn check_client_binding(groups: &[BoundNodeGroup], client_ca: bool) -> Result<(), ConfigError> {
    let mut missing = Vec::new();
    let unbound: Vec<String> = groups
        .iter()
        .filter(|g| g.client.is_none())
        .map(|g| g.group.cluster.to_string())
        .collect();
    if groups.len() > 1 && !unbound.is_empty() {
        missing.push(format!(
            "{} node groups are served on one listener, and {} name(s) no client ({}): write \
             each as --nodes MIN:MAX:CLUSTER@CLIENT, CLIENT being a DNS SAN (or, without SANs, \
             the CN) of that cluster's autoscaler's client certificate",
            groups.len(),
            unbound.len(),
            unbound.join(", ")
        ));
    }
    let bound = groups.len() - unbound.len();
    if !client_ca && (groups.len() > 1 || bound > 0) {
        missing.push(if bound > 0 {
            format!(
                "{bound} node group(s) name a client but --tls-client-ca is not set: without \
                 required client certificates no caller can be told apart; give --tls-client-ca \
                 (with --tls-cert and --tls-key)"
            )
        } else {
            "--tls-client-ca is not set: give it (with --tls-cert and --tls-key) so that every \
             autoscaler presents a client certificate naming it"
                .to_string()
        });
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(ConfigError::ClientBinding { missing })
    }
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
    const HEAD: &str = "[Global]\napi-url = https://cloud.example.com/client/api\napi-key = AK\n";

    fn ok(text: &str) -> CloudConfig {
        parse_cloud_config(text, "cloud-config").unwrap_or_else(|e| panic!("{e}\n---\n{text}"))
    }

    fn report(text: &str) -> CloudConfigReport {
        parse_cloud_config_report(text, "cloud-config", None, None)
            .unwrap_or_else(|e| panic!("{e}\n---\n{text}"))
    }

    /// The secret-key that `line`, written as line 4 after a valid head, yields.
    fn secret_of(line: &str) -> Result<String, String> {
        parse_cloud_config(&format!("{HEAD}{line}\n"), "c")
            .map(|c| c.secret_key)
            .map_err(|e| e.to_string())
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
                name: "minimal, as CKS's deploy-cloudstack-secret writes it",
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
                name: "secrets with = stay verbatim, backslashes inside quotes",
                text: "[Global]\napi-url = https://cloud.example.com/client/api\n\
                       api-key = ab=cd==\nsecret-key = \"s\\\\e\\\\\\\\cr=et\\\\n\"\n",
                key: "ab=cd==",
                secret: "s\\e\\\\cr=et\\n",
                ssl_no_verify: false,
                project: None,
                zone: None,
            },
            Case {
                name: "comment characters inside quotes, a comment after them",
                text: "[Global]\napi-url = https://cloud.example.com/client/api\n\
                       api-key = \"a;b#c\" ; the key\nsecret-key = \"abc\\\\\" # ends in a backslash\nzone = z\n",
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
            Case {
                name: "repeated [Global] sections merge; the last value wins",
                text: "[Global]\napi-url = https://cloud.example.com/client/api\nsecret-key = old\n\
                       [Other]\nsecret-key = not-this\n[GLOBAL]\napi-key = AK\nsecret-key = SK\n\
                       [ Global ]\nzone = z\n",
                key: "AK",
                secret: "SK",
                ssl_no_verify: false,
                project: None,
                zone: Some("z"),
            },
            Case {
                name: "byte-order mark, bare boolean, indented lines",
                text: "\u{feff}[Global]\n  api-url = https://cloud.example.com/client/api\n\tapi-key = AK\n\
                       secret-key = SK\nssl-no-verify\n",
                key: "AK",
                secret: "SK",
                ssl_no_verify: true,
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

    /// Each rule of gcfg's value syntax, on a `secret-key` line.
    #[test]
    fn values_are_read_as_gcfg_reads_them() {
        let cases: &[(&str, &str, &str)] = &[
            ("plain", "secret-key = value", "value"),
            ("no spaces around =", "secret-key=value", "value"),
            (
                "blanks around the value",
                "secret-key =  \t value \t ",
                "value",
            ),
            ("indented name", "   secret-key = value", "value"),
            (
                "internal blanks kept",
                "secret-key = va  l\tue",
                "va  l\tue",
            ),
            ("name in any case", "SECRET-Key = value", "value"),
            (
                "comment after blank",
                "secret-key = value ; comment",
                "value",
            ),
            ("# comment", "secret-key = value # comment", "value"),
            ("glued ; cuts", "secret-key = value;rest", "value"),
            ("glued # cuts", "secret-key = value#rest", "value"),
            ("quoted ;", "secret-key = \"va ; lue\"", "va ; lue"),
            (
                "quoted # then comment",
                "secret-key = \"va # lue\" ; c",
                "va # lue",
            ),
            ("quoted blanks kept", "secret-key = \" value \"", " value "),
            ("two quoted parts", "secret-key = \"val\" \"ue\"", "val ue"),
            ("partly quoted", "secret-key = ab\"c;d\"ef", "abc;def"),
            ("escaped backslash", "secret-key = \"a\\\\b\"", "a\\b"),
            ("escaped quote", "secret-key = \"a\\\"b\"", "a\"b"),
            ("escaped newline", "secret-key = \"a\\nb\"", "a\nb"),
            ("escaped tab", "secret-key = \"a\\tb\"", "a\tb"),
            ("unquoted \\\"", "secret-key = \\\"value\\\"", "\"value\""),
            (
                "continuation",
                "secret-key = value \\\n value",
                "value  value",
            ),
            ("continuation, CRLF", "secret-key = abc\\\r\ndef", "abcdef"),
            (
                "continuation then comment",
                "secret-key = abc\\\n;def",
                "abc",
            ),
            ("CRLF", "secret-key = value\r", "value"),
            (
                "last of repeated keys",
                "secret-key = first\nsecret-key = second",
                "second",
            ),
        ];
        for (name, line, want) in cases {
            assert_eq!(secret_of(line).as_deref(), Ok(*want), "{name}: {line:?}");
        }
    }

    /// gcfg refuses these; the error names line 4 (or the line given) and what was wrong, and
    /// never the secret.
    #[test]
    fn syntax_errors_name_the_line_and_never_the_secret() {
        let cases: &[(&str, &str, &[&str])] = &[
            ("secret-key = \"S3CR3T", "line 4", &["closing `\"`"]),
            (
                "secret-key = \"S3CR3T\nx = y\"",
                "line 4",
                &["closing `\"`"],
            ),
            (
                "secret-key = \"S3\\CR3T\"",
                "line 4",
                &["unknown escape", "`\\\\`"],
            ),
            (
                "secret-key = \"S3CR3T \\\n more\"",
                "line 4",
                &["unknown escape"],
            ),
            (
                "secret-key = S3\\CR3T",
                "line 4",
                &["outside double quotes", "`\\\\`"],
            ),
            (
                "secret_key = S3CR3T",
                "line 4",
                &["column 7", "`_`", "`secret-key`"],
            ),
            (
                "secret-key S3CR3T",
                "line 4",
                &["column 12", "expected `=`"],
            ),
            (
                "= S3CR3T",
                "line 4",
                &["column 1", "expected a [section] header"],
            ),
            ("\"S3CR3T\"", "line 4", &["column 1"]),
            ("[]", "line 4", &["section name"]),
            ("[Global \"\"]", "line 4", &["empty subsection"]),
            ("[Global \"S3CR3T]", "line 4", &["no closing"]),
            ("[Global \"S3\\nCR3T\"]", "line 4", &["only the escapes"]),
            ("[Global", "line 4", &["expected `]`"]),
            (
                "[Global] S3CR3T",
                "line 4",
                &["unexpected text after the section header"],
            ),
            ("secret-key = S3CR3T\0", "line 4", &["NUL"]),
            ("\nzone = z\nsecret-key = \"S3CR3T", "line 6", &["closing"]),
        ];
        for (line, at, needles) in cases {
            let err = secret_of(line).expect_err(line);
            assert!(err.contains("cloud-config c"), "{line:?}: {err}");
            assert!(err.contains(at), "{line:?}: {err} lacks {at:?}");
            for needle in *needles {
                assert!(err.contains(needle), "{line:?}: {err} lacks {needle:?}");
            }
            assert!(
                !err.contains("S3CR3T") && !err.contains("CR3T"),
                "{line:?}: {err}"
            );
        }
        // A backslash at the very end of the file continues nothing.
        let err = parse_cloud_config(&format!("{HEAD}secret-key = S3CR3T\\"), "c").unwrap_err();
        assert!(matches!(err, ConfigError::Syntax { line: 4, .. }), "{err}");
        assert!(!err.to_string().contains("S3CR3T"), "{err}");
        // Before any section.
        let err = parse_cloud_config("; c\nsecret-key = S3CR3T\n[Global]\n", "c").unwrap_err();
        assert!(matches!(err, ConfigError::Syntax { line: 2, .. }), "{err}");
        assert!(err.to_string().contains("[Global]") && !err.to_string().contains("S3CR3T"));
    }

    /// gcfg fills the in-tree `CSConfig`: string fields refuse a bare name, the boolean takes
    /// eight words (or a bare name for true) and nothing else.
    #[test]
    fn keys_take_the_values_gcfg_gives_their_types() {
        for (word, want) in [
            ("true", true),
            ("tRuE", true),
            ("yes", true),
            ("on", true),
            ("1", true),
            ("\"true\"", true),
            ("false", false),
            ("NO", false),
            ("off", false),
            ("0", false),
            ("true ; comment", true),
        ] {
            let cfg = ok(&format!("{HEAD}secret-key = S\nssl-no-verify = {word}\n"));
            assert_eq!(cfg.ssl_no_verify, want, "{word}");
        }
        assert!(ok(&format!("{HEAD}secret-key = S\nssl-no-verify\n")).ssl_no_verify);
        assert!(ok(&format!("{HEAD}secret-key = S\nSSL-No-Verify ; c\n")).ssl_no_verify);
        for (word, needle) in [
            ("", "\"\""),
            ("maybe", "\"maybe\""),
            ("\" true\"", "\" true\""),
            ("t", "\"t\""),
            ("2", "\"2\""),
        ] {
            // A later valid value does not excuse the bad one: gcfg stops at the first.
            let text =
                format!("{HEAD}secret-key = S\nssl-no-verify = {word}\nssl-no-verify = true\n");
            let err = parse_cloud_config(&text, "c").expect_err(word);
            let ConfigError::InvalidValue {
                line, key, reason, ..
            } = &err
            else {
                panic!("{word}: {err}");
            };
            assert_eq!((*line, key.as_str()), (5, "ssl-no-verify"), "{word}");
            assert!(
                reason.contains(needle) && reason.contains("yes"),
                "{word}: {err}"
            );
        }
        for key in ["api-url", "api-key", "secret-key", "project-id", "zone"] {
            let text = format!("{HEAD}secret-key = S3CR3T\n{key}\n");
            let err = parse_cloud_config(&text, "c").expect_err(key);
            assert!(
                matches!(&err, ConfigError::InvalidValue { line: 5, key: k, .. } if k == key),
                "{key}: {err}"
            );
            assert!(err.to_string().contains("no `= value`"), "{err}");
            assert!(!err.to_string().contains("S3CR3T"), "{err}");
        }
        // Empty optional values are unset; a quoted value keeps its blanks.
        let cfg = ok(&format!(
            "{HEAD}secret-key = S\nzone = \"\"\nproject-id = \" p \"\n"
        ));
        assert_eq!((cfg.zone, cfg.project_id.as_deref()), (None, Some(" p ")));
    }

    #[test]
    fn sections_and_subsections_follow_gcfg() {
        // A subsection of [Global] is not [Global]: gcfg does not store its keys there.
        let r = report(&format!(
            "{HEAD}secret-key = SK\n[Global \"extra\"]\nsecret-key = OTHER\n[global]\nzone = z\n"
        ));
        assert_eq!(
            (r.config.secret_key.as_str(), r.config.zone.as_deref()),
            ("SK", Some("z"))
        );
        assert!(
            r.warnings
                .iter()
                .any(|w| w.contains("line 5") && w.contains("subsection")),
            "{:?}",
            r.warnings
        );
        // Only a subsection: there is no [Global].
        let err = parse_cloud_config("[Global \"x\"]\napi-key = a\n", "c").unwrap_err();
        assert!(matches!(err, ConfigError::MissingSection { .. }), "{err}");
        // Header spellings gcfg accepts.
        for header in [
            "[Global]",
            "[ Global ]",
            "[GLOBAL] ; c",
            "  [global]# c",
            "[Global]\r",
        ] {
            let text = format!("{header}\napi-url = {URL}\napi-key = AK\nsecret-key = SK\n");
            assert_eq!(ok(&text).secret_key, "SK", "{header}");
        }
        // Comment lines, blank lines and blanks-only lines anywhere.
        let text = format!(
            "\n ; one\n\t# two\n   \n[Global]\n;api-key = no\napi-url = {URL}\n# secret-key = no\n\
             api-key = AK\n\nsecret-key = SK\n  \n"
        );
        let cfg = ok(&text);
        assert_eq!(
            (cfg.api_key.as_str(), cfg.secret_key.as_str()),
            ("AK", "SK")
        );
    }

    /// Unknown keys and sections stay ignored (gcfg as the in-tree provider calls it refuses
    /// them); each is a warning that names the line, never the value.
    #[test]
    fn unknown_keys_and_sections_warn_without_values() {
        let r = report(&format!(
            "{HEAD}secret-key = SK\nprojectid = V4LUE1\nregion = V4LUE2\n[LoadBalancer]\nsubnet = V4LUE3\n"
        ));
        assert_eq!(r.config.project_id, None);
        assert_eq!(r.warnings.len(), 3, "{:?}", r.warnings);
        assert!(
            r.warnings[0].contains("line 5")
                && r.warnings[0].contains("did you mean `project-id`?")
        );
        assert!(r.warnings[1].contains("line 6") && !r.warnings[1].contains("did you mean"));
        assert!(r.warnings[2].contains("line 7") && r.warnings[2].contains("[LoadBalancer]"));
        for w in &r.warnings {
            assert!(w.starts_with("cloud-config cloud-config line "), "{w}");
            assert!(!w.contains("V4LUE"), "{w}");
        }
        assert!(
            report(&format!("{HEAD}secret-key = SK\n"))
                .warnings
                .is_empty()
        );
    }

    /// A secret with an unquoted `;` or `#` is cut there, as gcfg cuts it. When the character
    /// sits right after value text, the operator hears about it, without the secret.
    #[test]
    fn a_value_cut_at_a_comment_character_warns_without_the_secret() {
        let r = report(&format!("{HEAD}secret-key = Abc123;Def456\n"));
        assert_eq!(r.config.secret_key, "Abc123");
        let [w] = r.warnings.as_slice() else {
            panic!("{:?}", r.warnings);
        };
        for needle in ["line 4", "`secret-key`", "unquoted `;`", "double quotes"] {
            assert!(w.contains(needle), "{w} lacks {needle}");
        }
        assert!(!w.contains("Abc123") && !w.contains("Def456"), "{w}");

        let r = report(&format!(
            "{HEAD}secret-key = Abc123#Def456\napi-key = K#ey\n"
        ));
        assert_eq!(
            (r.config.secret_key.as_str(), r.config.api_key.as_str()),
            ("Abc123", "K")
        );
        assert_eq!(r.warnings.len(), 2, "{:?}", r.warnings);
        assert!(r.warnings[1].contains("`api-key`") && r.warnings[1].contains("`#`"));

        // A comment after a blank, or after a quoted value, is a comment: no warning.
        for line in [
            "secret-key = Abc123 ; note",
            "secret-key = \"Abc;123\"  # note",
        ] {
            assert!(
                report(&format!("{HEAD}{line}\n")).warnings.is_empty(),
                "{line}"
            );
        }
        // Cut to nothing: the missing-key error says why, still without the secret.
        let err = parse_cloud_config(&format!("{HEAD}secret-key = #Def456\n"), "c").unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, ConfigError::MissingKey { .. }), "{message}");
        assert!(
            message.contains("line 4") && message.contains("`#`"),
            "{message}"
        );
        assert!(!message.contains("Def456"), "{message}");
        let err = parse_cloud_config(&format!("{HEAD}secret-key =\n"), "c").unwrap_err();
        assert!(
            err.to_string().contains("line 4 sets it to an empty value"),
            "{err}"
        );
    }

    /// The warning reaches the log through `parse_cloud_config`, and the secret does not.
    #[test]
    fn cut_warnings_are_logged_without_the_secret() {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Capture(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Capture {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let capture = Capture::default();
        let writer = capture.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let cfg = tracing::subscriber::with_default(subscriber, || {
            ok(&format!("{HEAD}secret-key = Zq9xWv7;Lp2Mn8\n"))
        });
        assert_eq!(cfg.secret_key, "Zq9xWv7");
        let out = String::from_utf8_lossy(&capture.0.lock().unwrap_or_else(|p| p.into_inner()))
            .to_string();
        assert!(
            out.contains("WARN") && out.contains("`secret-key`"),
            "{out}"
        );
        assert!(!out.contains("Zq9xWv7") && !out.contains("Lp2Mn8"), "{out}");
    }

    #[test]
    fn cloud_config_errors_name_the_source_and_the_key() {
        let cases: [(&str, &str, &[&str]); 8] = [
            (
                "api-url = x\n",
                "no section",
                &["my.ini", "line 1", "[Global]"],
            ),
            ("", "empty file", &["my.ini", "[Global]"]),
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
                &["line 5", "`ssl-no-verify`", "maybe"],
            ),
            (
                "[Global]\napi-url = cloud.example.com\napi-key = a\nsecret-key = b\n",
                "bad url",
                &["line 2", "`api-url`", "invalid"],
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

        let full = "[Global]\napi-url = https://cloud.example.com/client/api\napi-key = A\nsecret-key = S\n";
        let replaced = parse_cloud_config_with_keys(full, "f", None, Some("S2\n".into())).unwrap();
        assert_eq!(
            (replaced.api_key.as_str(), replaced.secret_key.as_str()),
            ("A", "S2")
        );
        assert_eq!(
            parse_cloud_config_with_keys(full, "f", Some(String::new()), None).unwrap(),
            ok(full),
            "an empty key from elsewhere leaves the file's"
        );
    }

    #[test]
    fn debug_masks_secrets() {
        let cfg = ok(
            "[Global]\napi-url = https://cloud.example.com/client/api\napi-key = APIKEY123\n\
                      secret-key = TOPSECRET\nssl-no-verify = true\nproject-id = p\n",
        );
        let shown = format!("{cfg:?}");
        assert!(
            !shown.contains("TOPSECRET") && !shown.contains("APIKEY123"),
            "{shown}"
        );
        assert!(shown.contains("APIK…"), "{shown}");
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
        let err = load_cloud_config_with_keys(&path, None, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&path.display().to_string()) && err.contains("`secret-key`"),
            "{err}"
        );
        let cfg = load_cloud_config_with_keys(&path, None, Some("S".into())).unwrap();
        assert_eq!(cfg.secret_key, "S");
        let missing = dir.join("absent");
        let err = load_cloud_config_with_keys(&missing, None, None).unwrap_err();
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

    #[test]
    fn nodes_binds_a_client_after_the_first_at() {
        let name = |n: &str| ClusterRef::Name(n.into());
        let cases: [(&str, ClusterRef, Option<&str>); 7] = [
            ("1:3:prod", name("prod"), None),
            (
                "1:3:prod@autoscaler.prod",
                name("prod"),
                Some("autoscaler.prod"),
            ),
            (
                "1:3:177d0eeb-ee9f-4bd6-b3b3-2e8e1bf4e1a4@ca-a",
                ClusterRef::Id(UUID.into()),
                Some("ca-a"),
            ),
            ("1:3:name=prod @ ca-a ", name("prod"), Some("ca-a")),
            ("1:3:id=x@ca-a", ClusterRef::Id("x".into()), Some("ca-a")),
            // A CN may hold spaces and an `@`: only the first `@` separates.
            (
                "1:3:prod@cluster autoscaler@prod",
                name("prod"),
                Some("cluster autoscaler@prod"),
            ),
            ("0:0:a@B.Example", name("a"), Some("B.Example")),
        ];
        for (input, cluster, client) in cases {
            let bound = parse_nodes(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(bound.group.cluster, cluster, "{input}");
            assert_eq!(bound.client.as_deref(), client, "{input}");
        }
        assert_eq!(
            parse_nodes("2:5:prod@ca")
                .map(|b| (b.group.min, b.group.max))
                .ok(),
            Some((2, 5))
        );
    }

    #[test]
    fn nodes_refuses_an_unusable_client_and_the_plain_reader_never_drops_one() {
        let cases: [(&str, &str); 5] = [
            ("1:3:prod@", "CLIENT after `@` is empty"),
            ("1:3:prod@  ", "CLIENT after `@` is empty"),
            ("1:3:prod@*.example", "wildcard"),
            ("1:3:prod@a\tb", "control character"),
            ("1:3:@ca-a", "CLUSTER is empty"),
        ];
        for (input, reason) in cases {
            let err = parse_nodes(input).expect_err(input).to_string();
            assert!(err.contains(reason), "{input}: {err}");
            assert!(err.contains(&format!("{input:?}")), "{err}");
            assert!(err.contains("MIN:MAX:CLUSTER@CLIENT"), "{err}");
        }
        let err = parse_nodes_spec("1:3:prod@ca-a").expect_err("binds a client");
        assert!(err.to_string().contains("binds client \"ca-a\""), "{err}");
        assert_eq!(
            parse_nodes_spec("1:3:prod").ok().map(|g| g.cluster),
            Some(ClusterRef::Name("prod".into()))
        );
    }

    #[test]
    fn several_groups_need_every_client_named_and_client_certificates_required() {
        let bound = |spec: &str| parse_nodes(spec).expect(spec);
        let a = bound("1:3:a@ca-a");
        let b = bound("1:3:b@ca-b");
        let plain_b = bound("1:3:b");
        let plain_a = bound("1:3:a");
        // Accepted: one unbound group, with or without mTLS; bound groups with mTLS.
        assert!(check_client_binding(std::slice::from_ref(&plain_a), false).is_ok());
        assert!(check_client_binding(std::slice::from_ref(&plain_a), true).is_ok());
        assert!(check_client_binding(&[a.clone(), b.clone()], true).is_ok());
        assert!(check_client_binding(std::slice::from_ref(&a), true).is_ok());
        // Refused, each naming what is missing.
        let refused = |groups: &[BoundNodeGroup], ca: bool| {
            check_client_binding(groups, ca)
                .expect_err("refused")
                .to_string()
        };
        let e = refused(&[a.clone(), plain_b.clone()], true);
        assert!(e.starts_with("client binding: "), "{e}");
        assert!(e.contains("1 name(s) no client (name=b)"), "{e}");
        assert!(!e.contains("--tls-client-ca is not set"), "{e}");
        let e = refused(&[a.clone(), b.clone()], false);
        assert!(
            e.contains("2 node group(s) name a client but --tls-client-ca is not set"),
            "{e}"
        );
        let e = refused(&[plain_a.clone(), plain_b.clone()], false);
        assert!(e.contains("2 name(s) no client (name=a, name=b)"), "{e}");
        assert!(e.contains("--tls-client-ca is not set"), "{e}");
        assert!(e.contains("delete them"), "the message says why: {e}");
        let e = refused(std::slice::from_ref(&a), false);
        assert!(e.contains("1 node group(s) name a client"), "{e}");
    }
}
