//! The commands an operator is told to run, as a shell would split them: read from the
//! guide's Markdown (fenced `sh` blocks, the `$ ` lines of `console` blocks, `kubectl` lines
//! of other blocks, inline code that starts with `kubectl`) and from the chart's NOTES.txt.
//!
//! Enough of `sh` for what the guide writes: single and double quotes, `\` escapes and line
//! continuations, comments, `|`, `||`, `&&`, `;`, `&`, redirections, `NAME=value` assignments
//! (substituted as `$NAME` and `${NAME}` in later words) and `NAME=$(command)` (the command kept,
//! so that `exec $NAME` is known to reach the pod that command names). Anything else is left
//! as written: a word that still holds a `$` is one the test cannot resolve.

use std::collections::BTreeMap;

/// One simple command of the guide or the NOTES.
#[derive(Clone, Debug)]
pub struct Cmd {
    /// Where it is written (`docs/operations.md:123`, `NOTES of R`).
    pub origin: String,
    /// Its words, quotes removed and known variables substituted.
    pub words: Vec<String>,
    /// The commands whose output the variables of this script hold (`pod=$(kubectl …)`).
    pub defs: BTreeMap<String, Vec<String>>,
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Word(String),
    /// `|`, `||`, `&&`, `;`, `&`, a newline, `$(`, `)`, a redirection.
    Op(String),
}

fn lex(text: &str) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = text.chars().peekable();
    let end_word = |out: &mut Vec<Tok>, word: &mut String, in_word: &mut bool| {
        if *in_word {
            out.push(Tok::Word(std::mem::take(word)));
            *in_word = false;
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    word.push(q);
                }
            }
            '"' => {
                in_word = true;
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' => {
                            if let Some(n) = chars.next() {
                                if !matches!(n, '"' | '\\' | '$' | '`') {
                                    word.push('\\');
                                }
                                word.push(n);
                            }
                        }
                        q => word.push(q),
                    }
                }
            }
            '\\' => match chars.next() {
                Some('\n') | None => {}
                Some(n) => {
                    in_word = true;
                    word.push(n);
                }
            },
            '#' if !in_word => {
                for q in chars.by_ref() {
                    if q == '\n' {
                        out.push(Tok::Op("\n".into()));
                        break;
                    }
                }
            }
            '$' if chars.peek() == Some(&'(') => {
                chars.next();
                end_word(&mut out, &mut word, &mut in_word);
                out.push(Tok::Op("$(".into()));
            }
            ')' => {
                end_word(&mut out, &mut word, &mut in_word);
                out.push(Tok::Op(")".into()));
            }
            // `<placeholder>` of the guide (a value to fill in), not a redirection.
            '<' if chars.peek().is_some_and(|n| n.is_ascii_alphabetic()) => {
                in_word = true;
                word.push('<');
                for q in chars.by_ref() {
                    word.push(q);
                    if q == '>' {
                        break;
                    }
                }
            }
            '|' | '&' | ';' | '\n' | '<' | '>' => {
                end_word(&mut out, &mut word, &mut in_word);
                let mut op = c.to_string();
                if matches!(c, '|' | '&' | '>') && chars.peek() == Some(&c) {
                    op.push(c);
                    chars.next();
                }
                out.push(Tok::Op(op));
            }
            c if c.is_whitespace() => end_word(&mut out, &mut word, &mut in_word),
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    end_word(&mut out, &mut word, &mut in_word);
    out
}

/// `$NAME` and `${NAME}` replaced by the variables known, longest names first.
fn substitute(word: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = word.to_string();
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for name in names {
        out = out
            .replace(&format!("${{{name}}}"), &vars[name])
            .replace(&format!("${name}"), &vars[name]);
    }
    out
}

fn assignment(word: &str) -> Option<(&str, &str)> {
    let (name, value) = word.split_once('=')?;
    let ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    ok.then_some((name, value))
}

/// The simple commands of a script, in order (those inside `$( )` too).
pub fn script(origin: &str, text: &str) -> Vec<Cmd> {
    let toks = lex(text);
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    let mut defs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut out = Vec::new();
    // A stack of commands being read: the outer one, and one per open `$(`.
    let mut stack: Vec<Vec<String>> = vec![Vec::new()];
    let mut redirect = false;
    let finish = |words: Vec<String>,
                  vars: &mut BTreeMap<String, String>,
                  defs: &BTreeMap<String, Vec<String>>,
                  out: &mut Vec<Cmd>| {
        let mut words: Vec<String> = words.iter().map(|w| substitute(w, vars)).collect();
        while words
            .first()
            .is_some_and(|w| matches!(w.as_str(), "do" | "then" | "else" | "time"))
        {
            words.remove(0);
        }
        if words.is_empty() {
            return;
        }
        if words.iter().all(|w| assignment(w).is_some()) {
            for w in &words {
                if let Some((n, v)) = assignment(w) {
                    vars.insert(n.to_string(), v.to_string());
                }
            }
            return;
        }
        out.push(Cmd {
            origin: origin.to_string(),
            words,
            defs: defs.clone(),
        });
    };
    for tok in toks {
        match tok {
            Tok::Word(w) => {
                if redirect {
                    redirect = false;
                } else {
                    stack.last_mut().expect("a command").push(w);
                }
            }
            Tok::Op(op) if op == "$(" => stack.push(Vec::new()),
            Tok::Op(op) if op == ")" => {
                if stack.len() > 1 {
                    let inner = stack.pop().expect("an inner command");
                    let subst: Vec<String> = inner.iter().map(|w| substitute(w, &vars)).collect();
                    let outer = stack.last_mut().expect("a command");
                    // `NAME=$(…)`: the variable holds what the command prints.
                    if let Some(last) = outer.last()
                        && let Some((name, "")) = assignment(last)
                    {
                        defs.insert(name.to_string(), subst);
                        outer.pop();
                    }
                    finish(inner, &mut vars, &defs, &mut out);
                }
            }
            Tok::Op(op) if matches!(op.as_str(), "<" | ">" | ">>") => redirect = true,
            Tok::Op(_) => {
                // Inside `$( )` a newline is a line continuation the guide wrote with `\`.
                if stack.len() == 1 {
                    let words = std::mem::take(&mut stack[0]);
                    finish(words, &mut vars, &defs, &mut out);
                }
            }
        }
    }
    for words in stack.into_iter().rev() {
        finish(words, &mut vars, &defs, &mut out);
    }
    out
}

/// The commands of a Markdown file: every fenced `sh`/`bash`/`shell` block as a script, the
/// `$ ` lines of `console` blocks, the lines of other blocks that start with `kubectl`, and
/// inline code that starts with `kubectl ` (a span may run over lines).
pub fn markdown(file: &str, text: &str) -> Vec<Cmd> {
    let mut out = Vec::new();
    let mut prose = String::new();
    let mut fence: Option<(String, usize, String)> = None; // (lang, first line, body)
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("```") {
            match fence.take() {
                None => {
                    fence = Some((rest.trim().to_string(), n + 2, String::new()));
                    prose.push('\n');
                }
                Some((lang, first, body)) => {
                    let origin = format!("{file}:{first}");
                    match lang.as_str() {
                        "sh" | "bash" | "shell" => out.extend(script(&origin, &body)),
                        "console" => {
                            for l in body.lines().filter_map(|l| l.strip_prefix("$ ")) {
                                out.extend(script(&origin, l));
                            }
                        }
                        _ => {
                            for l in body.lines().filter(|l| l.starts_with("kubectl ")) {
                                out.extend(script(&origin, l));
                            }
                        }
                    }
                    prose.push('\n');
                }
            }
            continue;
        }
        match &mut fence {
            Some((_, _, body)) => {
                body.push_str(line);
                body.push('\n');
                prose.push('\n');
            }
            None => {
                prose.push_str(line);
                prose.push('\n');
            }
        }
    }
    // Inline code: between single backticks, newlines and the indentation after them read as
    // one space (as Markdown renders them).
    let mut rest = prose.as_str();
    let mut line = 1;
    while let Some(open) = rest.find('`') {
        line += rest[..open].matches('\n').count();
        let after = &rest[open + 1..];
        let Some(close) = after.find('`') else { break };
        let span = &after[..close];
        let flat = span.split_whitespace().collect::<Vec<_>>().join(" ");
        if flat.starts_with("kubectl ") {
            out.extend(script(&format!("{file}:{line}"), &flat));
        }
        line += span.matches('\n').count();
        rest = &after[close + 1..];
    }
    out
}

#[test]
fn the_shell_reader_splits_as_sh_does() {
    let cmds = script(
        "t",
        "ns=kube-system; s=a-b\nfor k in x y; do\n  kubectl -n $ns get secret $s -o jsonpath=\"{.data.${k//./\\\\.}}\" | base64 -d > $k\ndone\n\
         pod=$(kubectl -n $ns get pod -o name \\\n  -l app=x,role=leader)\nkubectl -n $ns exec $pod -c c -- \\\n  /bin/true --flag # a comment\n\
         kubectl logs -l 'a=b' --tail=-1 | grep -E 'x|y'\nkubectl uncordon <a node> > out\n",
    );
    let words: Vec<String> = cmds.iter().map(|c| c.words.join(" ")).collect();
    assert_eq!(
        words,
        [
            "for k in x y",
            "kubectl -n kube-system get secret a-b -o jsonpath={.data.${k//./\\.}}",
            "base64 -d",
            "done",
            "kubectl -n kube-system get pod -o name -l app=x,role=leader",
            "kubectl -n kube-system exec $pod -c c -- /bin/true --flag",
            "kubectl logs -l a=b --tail=-1",
            "grep -E x|y",
            "kubectl uncordon <a node>",
        ]
    );
    assert_eq!(
        cmds[5].defs.get("pod").map(|d| d.join(" ")).as_deref(),
        Some("kubectl -n kube-system get pod -o name -l app=x,role=leader")
    );
    let md = markdown(
        "m",
        "Run `kubectl -n x logs\n  deploy/y` now.\n\n   ```sh\n   kubectl get a\n   ```\n```console\n$ kubectl get b\nout\n```\n",
    );
    let words: Vec<String> = md.iter().map(|c| c.words.join(" ")).collect();
    assert_eq!(
        words,
        [
            "kubectl get a",
            "kubectl get b",
            "kubectl -n x logs deploy/y"
        ]
    );
}
