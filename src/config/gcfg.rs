//! The ini syntax of a cloud-config, read as gcfg (`gopkg.in/gcfg.v1`) reads it: names,
//! section headers, quoting, escapes, continuations and comments, handed over as [`Event`]s in
//! file order. It is apart from what the keys mean so that how a line splits into a name and a
//! value is decided in one place, by gcfg's scanner's rules alone, and stays the same for any
//! key: an operator's file must mean here what it means to the in-tree provider.

use super::ConfigError;

/// The unquoted `;` or `#` that ended a value; `glued` when it came right after value text
/// (`abc;def`), which looks like part of the value rather than a comment.
#[derive(Clone, Copy)]
pub(super) struct CommentStart {
    pub(super) ch: char,
    pub(super) glued: bool,
}

/// What the gcfg reader hands over, in file order: a section header or a variable.
pub(super) enum Event {
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
pub(super) fn read_gcfg(
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
