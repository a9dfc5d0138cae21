//! The architecture ARCHITECTURE.md states, checked on the workspace and the source rather than
//! kept by hand: the crate graph (from `cargo metadata`) is the one listed there, the production
//! crate depends on none of the fixtures, the domain on nothing; the provider crate's modules
//! depend on each other as listed; no file imports another that (directly or not) imports it
//! back; only the gRPC server and client code names tonic; no source file outside tests is
//! longer than a reader can hold.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `src/` of every crate of the workspace: the provider's, each one under `crates/` and the
/// fuzz crate's.
fn crate_sources() -> Vec<(String, PathBuf)> {
    let mut out = vec![
        ("cks-autoscaler-provider".to_string(), root().join("src")),
        (
            "cks-autoscaler-provider-fuzz".to_string(),
            root().join("fuzz/src"),
        ),
    ];
    for entry in std::fs::read_dir(root().join("crates")).expect("crates/") {
        let dir = entry.expect("entry").path();
        let name = format!("cks-{}", dir.file_name().expect("name").to_string_lossy());
        out.push((name, dir.join("src")));
    }
    out.sort();
    out
}

/// Module path (`provider::ops`) → source without comments and test modules.
fn modules() -> BTreeMap<String, String> {
    modules_of(&root().join("src"))
}

fn modules_of(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for file in production_files(src) {
        let mut name = file
            .relative
            .with_extension("")
            .to_string_lossy()
            .replace('/', "::");
        if let Some(parent) = name.strip_suffix("::mod") {
            name = parent.to_string();
        }
        if name == "lib" || name == "main" || name.starts_with("bin::") {
            continue;
        }
        let code = file
            .code
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        out.insert(name, code);
    }
    out
}

/// A source file of a crate's `src/` that is not a test module, with its code outside its test
/// modules.
struct SourceFile {
    path: PathBuf,
    /// The path under `src/`.
    relative: PathBuf,
    code: String,
}

/// Every `.rs` file under `src` but the test modules (a file a `#[cfg(test)] mod x;` declares,
/// and the files under its directory), each with its code outside its own test modules.
fn production_files(src: &Path) -> Vec<SourceFile> {
    let mut files = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut test_paths = Vec::new();
    let mut out = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).expect("read file");
        let (code, declared) = without_test_modules(&text);
        let parent = path.parent().expect("parent");
        let module_dir = match path.file_name().and_then(|n| n.to_str()) {
            Some("mod.rs" | "lib.rs" | "main.rs") => parent.to_path_buf(),
            _ => parent.join(path.file_stem().expect("stem")),
        };
        for module in declared {
            match module {
                Declared::Name(name) => {
                    test_paths.push(module_dir.join(format!("{name}.rs")));
                    test_paths.push(module_dir.join(name));
                }
                Declared::Path(file) => test_paths.push(parent.join(file)),
            }
        }
        out.push(SourceFile {
            relative: path.strip_prefix(src).expect("under src").to_path_buf(),
            path,
            code,
        });
    }
    out.retain(|f| !test_paths.iter().any(|t| f.path.starts_with(t)));
    out
}

/// A test module a file declares without its body: `mod name;` or `#[path = "file"] mod name;`.
#[derive(Debug, PartialEq)]
enum Declared {
    Name(String),
    Path(String),
}

/// `text` without its test modules (each `mod` item under `#[cfg(test)]`, whatever its name
/// and visibility: a declaration `mod tests;` and an inline `mod tests { … }` wherever it
/// stands), and the modules it declares that way.
fn without_test_modules(text: &str) -> (String, Vec<Declared>) {
    const CFG_TEST: &str = "#[cfg(test)]";
    let mut out = String::with_capacity(text.len());
    let mut declared = Vec::new();
    let mut at = 0;
    while let Some(found) = text[at..].find(CFG_TEST) {
        let start = at + found;
        let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
        let item = if text[line_start..start].trim().is_empty() {
            test_module_item(text, start + CFG_TEST.len())
        } else {
            None
        };
        match item {
            Some((end, module)) => {
                out.push_str(&text[at..line_start]);
                declared.extend(module);
                // The rest of the item's last line goes with it when nothing else is on it.
                let rest = text[end..].find('\n').map_or(text.len(), |i| end + i + 1);
                at = if text[end..rest].trim().is_empty() {
                    rest
                } else {
                    end
                };
            }
            None => {
                out.push_str(&text[at..start + CFG_TEST.len()]);
                at = start + CFG_TEST.len();
            }
        }
    }
    out.push_str(&text[at..]);
    (out, declared)
}

/// The `mod` item that follows a `#[cfg(test)]` ending at `from`, if it is one: where it ends
/// and, for a declaration, the module it declares.
fn test_module_item(text: &str, from: usize) -> Option<(usize, Option<Declared>)> {
    let mut at = from;
    let skip_space = |at: usize| at + (text[at..].len() - text[at..].trim_start().len());
    let mut path = None;
    // More attributes (`#[path = "…"]`, `#[allow(…)]`).
    loop {
        at = skip_space(at);
        if !text[at..].starts_with("#[") {
            break;
        }
        let close = at + text[at..].find(']')?;
        let attribute = &text[at + 2..close];
        if let Some(value) = attribute.trim().strip_prefix("path") {
            path = Some(
                value
                    .trim()
                    .trim_start_matches('=')
                    .trim()
                    .trim_matches('"'),
            );
        }
        at = close + 1;
    }
    if text[at..].starts_with("pub") {
        at += 3;
        at = skip_space(at);
        if text[at..].starts_with('(') {
            at += text[at..].find(')')? + 1;
        }
        at = skip_space(at);
    }
    let rest = text[at..].strip_prefix("mod")?;
    if !rest.starts_with(char::is_whitespace) {
        return None;
    }
    at = skip_space(at + 3);
    let name_len = text[at..]
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len() - at);
    let name = &text[at..at + name_len];
    at = skip_space(at + name_len);
    match text[at..].chars().next()? {
        ';' => {
            let module = match path {
                Some(file) => Declared::Path(file.to_string()),
                None => Declared::Name(name.to_string()),
            };
            Some((at + 1, Some(module)))
        }
        '{' => Some((block_end(text, at)?, None)),
        _ => None,
    }
}

/// Just past the `}` closing the `{` at `open`, braces in comments, strings and character
/// literals left out of the count.
fn block_end(text: &str, open: usize) -> Option<usize> {
    let b = text.as_bytes();
    let ident = |i: usize| b[i].is_ascii_alphanumeric() || b[i] == b'_';
    let mut depth = 0usize;
    let mut i = open;
    while i < b.len() {
        match b[i] {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                i = text[i..].find('\n').map_or(b.len(), |n| i + n);
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut nested = 0usize;
                loop {
                    if text[i..].starts_with("/*") {
                        nested += 1;
                        i += 2;
                    } else if text[i..].starts_with("*/") {
                        nested -= 1;
                        i += 2;
                        if nested == 0 {
                            break;
                        }
                    } else if i >= b.len() {
                        return None;
                    } else {
                        i += 1;
                    }
                }
                continue;
            }
            // A raw string (`r"…"`, `r#"…"#`, `br#"…"#`).
            b'r' if (i == 0
                || !ident(i - 1)
                || (matches!(b[i - 1], b'b' | b'c') && (i < 2 || !ident(i - 2))))
                && text[i + 1..].trim_start_matches('#').starts_with('"') =>
            {
                let hashes = text[i + 1..].len() - text[i + 1..].trim_start_matches('#').len();
                let body = i + 1 + hashes + 1;
                let close = format!("\"{}", "#".repeat(hashes));
                i = body + text[body..].find(&close)? + close.len();
                continue;
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            }
            // A character literal (`'{'`, `'\''`, `'\u{7b}'`), else a lifetime or a label.
            b'\'' => {
                if b.get(i + 1) == Some(&b'\\') {
                    i += 3 + text.get(i + 3..)?.find('\'')?;
                } else {
                    let c = text[i + 1..].chars().next()?;
                    let after = i + 1 + c.len_utf8();
                    if b.get(after) == Some(&b'\'') {
                        i = after;
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The modules a module's code names through `crate::…` or `super::…` paths (`use` lists
/// included), as the longest module prefix of each path.
fn dependencies(module: &str, code: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    for start in ["crate::", "super::"] {
        let mut at = 0;
        while let Some(i) = code[at..].find(start) {
            let begin = at + i;
            at = begin + start.len();
            if begin > 0 && (bytes[begin - 1].is_ascii_alphanumeric() || bytes[begin - 1] == b'_') {
                continue;
            }
            let mut end = begin;
            while end < bytes.len()
                && (bytes[end].is_ascii_alphanumeric() || b"_:".contains(&bytes[end]))
            {
                end += 1;
            }
            let path = code[begin..end].trim_end_matches(':').to_string();
            // `use crate::x::{a, b::c}`: each item is a path of its own.
            if code[end..].starts_with('{')
                && let Some(close) = code[end..].find('}')
            {
                for item in code[end + 1..end + close].split(',') {
                    let item = item
                        .trim()
                        .split(|c: char| c.is_whitespace() || c == '{')
                        .next()
                        .unwrap_or_default();
                    if !item.is_empty() {
                        paths.push(format!("{path}::{item}"));
                    }
                }
                continue;
            }
            paths.push(path);
        }
    }
    let mut out = BTreeSet::new();
    for path in paths {
        let mut parts: Vec<&str> = path.split("::").collect();
        let mut base: Vec<&str> = Vec::new();
        match parts.first() {
            Some(&"crate") => {
                parts.remove(0);
            }
            Some(&"super") => {
                // `super` of `a::b` (file a/b.rs) is `a`; of a directory module `a`
                // (a/mod.rs) it is the crate root: one level up either way.
                base = module.split("::").collect();
                while parts.first() == Some(&"super") {
                    parts.remove(0);
                    base.pop();
                }
            }
            _ => continue,
        }
        for take in (1..=parts.len()).rev() {
            let candidate = base
                .iter()
                .chain(parts[..take].iter())
                .copied()
                .collect::<Vec<_>>()
                .join("::");
            if known.contains(&candidate) {
                if candidate != module && !module.starts_with(&format!("{candidate}::")) {
                    out.insert(candidate);
                }
                break;
            }
        }
    }
    out
}

/// Strongly connected components of more than one module.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Reachability closure: small graph, so a plain search from every node is enough.
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(m) = stack.pop() {
            for d in edges.get(&m).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    stack.push(d.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        edges.keys().map(|m| (m, reach(m))).collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    for m in edges.keys() {
        let comp: Vec<String> = edges
            .keys()
            .filter(|o| *o == m || (reaches[m].contains(*o) && reaches[*o].contains(m)))
            .cloned()
            .collect();
        if comp.len() > 1 && !out.contains(&comp) {
            out.push(comp);
        }
    }
    out
}

fn edges_of(modules: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let known: BTreeSet<String> = modules.keys().cloned().collect();
    modules
        .iter()
        .map(|(m, code)| (m.clone(), dependencies(m, code, &known)))
        .collect()
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let provider = edges_of(&modules());
    assert!(
        provider.get("grpc").is_some_and(|d| d.contains("provider")),
        "the scan sees imports (grpc uses the provider): {:?}",
        provider.get("grpc")
    );
    for (name, src) in crate_sources() {
        let edges = edges_of(&modules_of(&src));
        assert_no_cycles(&name, &edges);
    }
}

fn assert_no_cycles(name: &str, edges: &BTreeMap<String, BTreeSet<String>>) {
    let found = cycles(edges);
    let shown: Vec<String> = found
        .iter()
        .map(|c| {
            c.iter()
                .map(|m| {
                    let inside: Vec<&String> = edges[m].iter().filter(|d| c.contains(d)).collect();
                    format!("{m} -> {inside:?}")
                })
                .collect::<Vec<_>>()
                .join("; ")
        })
        .collect();
    assert!(
        found.is_empty(),
        "{name}: import cycles between files: {shown:#?}"
    );
}

#[test]
fn only_the_grpc_server_and_client_code_names_tonic() {
    let may = |m: &str| {
        ["grpc", "server", "tls", "probe"]
            .iter()
            .any(|allowed| m == *allowed || m.starts_with(&format!("{allowed}::")))
    };
    let offenders: Vec<String> = modules()
        .into_iter()
        .filter(|(m, code)| !may(m) && code.contains("tonic"))
        .map(|(m, _)| m)
        .collect();
    assert!(
        offenders.is_empty(),
        "modules outside the gRPC server and client naming tonic: {offenders:?}"
    );
    let must_not = ["provider", "config", "template", "options", "metrics"];
    for m in must_not {
        assert!(!may(m), "{m} is not allowed to name tonic");
    }
}

/// `cargo metadata` of the workspace: each crate's dependencies, `(name, kind)` with kind
/// `normal`, `dev` or `build`.
fn workspace_dependencies() -> BTreeMap<String, Vec<(String, String)>> {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let mut crates = BTreeMap::new();
    for package in meta["packages"].as_array().expect("packages") {
        let name = package["name"].as_str().expect("name").to_string();
        let deps = package["dependencies"]
            .as_array()
            .expect("dependencies")
            .iter()
            .map(|d| {
                let kind = d["kind"].as_str().unwrap_or("normal").to_string();
                (d["name"].as_str().expect("dep name").to_string(), kind)
            })
            .collect();
        crates.insert(name, deps);
    }
    crates
}

/// The `- `a` → `b`, `c`` lines (or `→ nothing`) under the ARCHITECTURE.md heading `heading`.
fn listed(heading: &str) -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let section = text
        .split("\n### ")
        .find(|s| s.starts_with(heading))
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has no section {heading:?}"));
    let section = section.split("\n## ").next().unwrap_or_default();
    let mut out = BTreeMap::new();
    for line in section.lines() {
        let Some(rest) = line.strip_prefix("- `") else {
            continue;
        };
        let (from, to) = rest.split_once("` → ").expect("`a` → list");
        let to: BTreeSet<String> = if to.trim() == "nothing" {
            BTreeSet::new()
        } else {
            to.split(',')
                .map(|d| d.trim().trim_matches('`').to_string())
                .collect()
        };
        out.insert(from.to_string(), to);
    }
    out
}

#[test]
fn the_crate_graph_is_the_one_architecture_md_lists() {
    let all = workspace_dependencies();
    let members: BTreeSet<&String> = all.keys().collect();
    let actual: BTreeMap<String, BTreeSet<String>> = all
        .iter()
        .map(|(name, deps)| {
            let inside = deps
                .iter()
                .filter(|(d, kind)| kind == "normal" && members.contains(d))
                .map(|(d, _)| d.clone())
                .collect();
            (name.clone(), inside)
        })
        .collect();
    assert_eq!(
        listed("Crates"),
        actual,
        "ARCHITECTURE.md's crate list against cargo metadata (normal dependencies)"
    );
}

#[test]
fn production_links_no_fixture_and_the_domain_no_io() {
    let all = workspace_dependencies();
    let normal = |name: &str| -> BTreeSet<String> {
        all[name]
            .iter()
            .filter(|(_, kind)| kind == "normal")
            .map(|(d, _)| d.clone())
            .collect()
    };
    // Everything the production binary links, through workspace crates.
    let mut closure = BTreeSet::new();
    let mut stack = vec!["cks-autoscaler-provider".to_string()];
    while let Some(c) = stack.pop() {
        if all.contains_key(&c) && closure.insert(c.clone()) {
            stack.extend(normal(&c));
        }
    }
    for fixture in [
        "cks-sim",
        "cks-lab",
        "cks-testkit",
        "cks-autoscaler-provider-fuzz",
    ] {
        assert!(
            !closure.contains(fixture),
            "the production crate links {fixture}: {closure:?}"
        );
    }
    assert_eq!(
        normal("cks-domain"),
        BTreeSet::new(),
        "the domain core depends on nothing: no runtime, no HTTP, no gRPC"
    );
    let sim_uses: Vec<String> = normal("cks-sim")
        .into_iter()
        .filter(|d| all.contains_key(d))
        .collect();
    assert!(
        sim_uses.is_empty(),
        "the simulator shares no code with the provider: {sim_uses:?}"
    );
    for no_grpc in ["cks-domain", "cks-cloudstack"] {
        assert!(
            !normal(no_grpc).contains("tonic"),
            "{no_grpc} names no gRPC type"
        );
    }
}

#[test]
fn the_provider_modules_depend_on_each_other_as_listed() {
    let edges = edges_of(&modules());
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, deps) in &edges {
        let head = |p: &str| p.split("::").next().unwrap_or_default().to_string();
        let entry = top.entry(head(m)).or_default();
        for d in deps {
            if head(d) != head(m) {
                entry.insert(head(d));
            }
        }
    }
    assert_eq!(
        listed("Modules of cks-autoscaler-provider"),
        top,
        "ARCHITECTURE.md's module list against the `crate::` paths of each module"
    );
}

/// Longest a source file may be outside its test modules: what a reader can hold.
const MAX_LINES: usize = 800;

/// Files allowed over [`MAX_LINES`] for now, each with the reason. Temporary: an entry whose
/// file is back under the limit fails the check until it is removed.
const OVER_THE_LIMIT: [(&str, &str); 0] = [];

/// Lines of each production file outside its test modules, over [`MAX_LINES`]: the file's path
/// from the workspace root and the count.
fn long_files() -> Vec<(String, usize)> {
    let mut long = Vec::new();
    for (_, src) in crate_sources() {
        for file in production_files(&src) {
            let lines = file.code.lines().count();
            if lines > MAX_LINES {
                let path = file.path.strip_prefix(root()).expect("under the root");
                long.push((path.to_string_lossy().into_owned(), lines));
            }
        }
    }
    long.sort();
    long
}

#[test]
fn no_source_file_is_longer_than_a_reader_can_hold() {
    let long = long_files();
    let allowed = |path: &str| OVER_THE_LIMIT.iter().any(|(p, _)| *p == path);
    let offenders: Vec<&(String, usize)> = long.iter().filter(|(p, _)| !allowed(p)).collect();
    assert!(
        offenders.is_empty(),
        "source files over {MAX_LINES} lines outside their test modules: {offenders:#?}"
    );
    for (path, reason) in OVER_THE_LIMIT {
        assert!(
            long.iter().any(|(p, _)| p == path),
            "{path} ({reason}) is no longer over {MAX_LINES} lines: take it off OVER_THE_LIMIT"
        );
    }
}

/// The count leaves out a file's test modules wherever they stand, and only them: a
/// `#[cfg(test)] mod tests;` at the top counts nothing, an inline one anywhere is left out to
/// its closing brace (braces in its strings, characters and comments do not close it), and
/// the files it declares are not production files.
#[test]
fn the_line_count_leaves_out_test_modules_and_only_them() {
    let code = |n: usize, what: &str| format!("fn {what}() {{}}\n").repeat(n);
    let text = format!(
        "#[cfg(test)]\nmod tests;\n{}#[cfg(test)]\npub(crate) mod fixtures {{\n    \
         const A: char = '{{';\n    const B: &str = \"}}}}\";\n    // }} }}\n    \
         const C: &str = r#\"\"}}\"#;\n    fn f<'a>(x: &'a str) -> &'a str {{ x }}\n}}\n{}\
         #[cfg(test)] mod inline {{ #[test] fn t() {{ let _ = '\\''; }} }}\n{}\
         #[cfg(test)]\n#[path = \"other.rs\"]\nmod other;\n#[cfg(test)]\nfn helper() {{}}\n",
        code(3, "a"),
        code(2, "b"),
        code(4, "c"),
    );
    let (kept, declared) = without_test_modules(&text);
    assert_eq!(
        kept,
        format!(
            "{}{}{}#[cfg(test)]\nfn helper() {{}}\n",
            code(3, "a"),
            code(2, "b"),
            code(4, "c")
        ),
        "from {text}"
    );
    assert_eq!(
        declared,
        [
            Declared::Name("tests".into()),
            Declared::Path("other.rs".into())
        ]
    );
    let unclosed = "#[cfg(test)]\nmod tests {\n    fn f() {}\n";
    assert_eq!(
        without_test_modules(unclosed).0,
        unclosed,
        "kept when its end is not found"
    );

    // On the workspace: a file that declares its tests at the top is counted whole, and the
    // test files are not counted at all.
    let provider = production_files(&root().join("src"));
    let relative: Vec<String> = provider
        .iter()
        .map(|f| f.relative.to_string_lossy().into_owned())
        .collect();
    assert!(
        relative.contains(&"provider/mod.rs".to_string())
            && !relative.contains(&"provider/tests.rs".to_string()),
        "{relative:?}"
    );
    let lab = production_files(&root().join("crates/lab/src"));
    assert!(
        lab.iter()
            .all(|f| !f.relative.starts_with("autoscaler/tests")),
        "the autoscaler's test directory is a test module"
    );
}

/// Every file of a `tests/it/` directory (the provider's and each crate's) is a module of that
/// test binary: a file its `main.rs` does not name is never compiled, and its tests never run.
#[test]
fn every_integration_test_file_is_in_its_test_binary() {
    let mut dirs = Vec::new();
    for (_, src) in crate_sources() {
        let it = src.parent().expect("crate dir").join("tests/it");
        if it.is_dir() {
            dirs.push(it);
        }
    }
    assert!(
        dirs.len() >= 2,
        "the provider's and the simulator's: {dirs:?}"
    );
    let mut missing = Vec::new();
    for dir in dirs {
        let main = std::fs::read_to_string(dir.join("main.rs")).expect("tests/it/main.rs");
        let named: BTreeSet<&str> = main
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                let l = l.strip_prefix("pub ").unwrap_or(l);
                l.strip_prefix("mod ")?.strip_suffix(';')
            })
            .collect();
        for entry in std::fs::read_dir(&dir).expect("read tests/it") {
            let path = entry.expect("entry").path();
            let module = if path.is_dir() {
                path.file_name()
            } else if path.extension().is_some_and(|e| e == "rs") {
                path.file_stem()
            } else {
                continue;
            };
            let module = module.expect("name").to_string_lossy().into_owned();
            if module != "main" && !named.contains(module.as_str()) {
                missing.push(path.strip_prefix(root()).unwrap_or(&path).to_path_buf());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "files their test binary's main.rs does not declare (never compiled): {missing:?}"
    );
}

/// The backticked names in `markdown` that look like paths of this repository: a `/` or a file
/// extension, nothing but path characters, not an HTTP path (`/metrics`) nor a Go module
/// (`k8s.io/kubernetes`). Fenced code blocks are left out.
fn named_paths(markdown: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for span in line.split('`').skip(1).step_by(2) {
            let path_chars = span
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c));
            let extension = [
                ".rs", ".md", ".toml", ".sh", ".py", ".proto", ".yaml", ".json",
            ]
            .iter()
            .any(|e| span.ends_with(e));
            let first = span.split('/').next().unwrap_or_default();
            let go_module = span.contains('/') && !first.starts_with('.') && first.contains('.');
            if path_chars
                && !span.is_empty()
                && !span.starts_with('/')
                && !go_module
                && (span.contains('/') || extension || span == "Dockerfile")
            {
                out.insert(span.to_string());
            }
        }
    }
    out
}

/// Every file and directory of the repository (directories with a trailing `/`), from the
/// root, build output and git's own files left out.
fn repository_paths() -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root().to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let path = entry.expect("entry").path();
            let name = path.file_name().expect("name").to_string_lossy();
            if name == ".git" || name == "target" {
                continue;
            }
            let relative = path.strip_prefix(root()).expect("under the root");
            let relative = relative.to_string_lossy().into_owned();
            if path.is_dir() {
                out.push(format!("{relative}/"));
                stack.push(path);
            } else {
                out.push(relative);
            }
        }
    }
    out
}

/// A path named in a document exists: from the repository's root when it starts with a
/// top-level entry (`src/…`, `crates/…`, `build.rs`), else as the end of some path of the
/// repository (`machine/tests.rs` for `crates/domain/src/machine/tests.rs`).
fn missing_paths(named: &BTreeSet<String>) -> Vec<String> {
    let all = repository_paths();
    named
        .iter()
        .filter(|path| {
            let first = path.split('/').next().unwrap_or_default();
            if root().join(first).exists() {
                !root().join(path.as_str()).exists()
            } else {
                !all.iter()
                    .any(|p| p == *path || p.ends_with(&format!("/{path}")))
            }
        })
        .cloned()
        .collect()
}

#[test]
fn every_path_architecture_md_names_exists() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let named = named_paths(&text);
    for sure in [
        "crates/domain/",
        "tests/it/architecture.rs",
        "machine/tests.rs",
        ".ci/run",
    ] {
        assert!(named.contains(sure), "{sure} is read as a path: {named:?}");
    }
    for not_a_path in ["/metrics", "k8s.io/kubernetes", "1h30m"] {
        assert!(!named.contains(not_a_path), "{not_a_path} is not a path");
    }
    let probe: BTreeSet<String> = ["src/autoscaler/", "crates/lab/src/autoscaler/", "nope/x.rs"]
        .map(String::from)
        .into();
    assert_eq!(
        missing_paths(&probe),
        ["nope/x.rs", "src/autoscaler/"],
        "a path from the root must exist from the root"
    );
    let missing = missing_paths(&named);
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist: {missing:?}"
    );
}
