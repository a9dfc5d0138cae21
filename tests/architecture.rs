//! The architecture invariants ARCHITECTURE.md states as absences, checked on the source:
//! no file imports another that (directly or not) imports it back, and only the gRPC server
//! and client code names tonic.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`provider::ops`) → source without comments and `#[cfg(test)] mod tests`.
fn modules() -> BTreeMap<String, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path: PathBuf = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(&src).expect("under src");
            let mut name = rel.with_extension("").to_string_lossy().replace('/', "::");
            if let Some(parent) = name.strip_suffix("::mod") {
                name = parent.to_string();
            }
            if name == "lib" || name == "main" || name.starts_with("bin::") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read file");
            let code = text
                .split("#[cfg(test)]\nmod tests {")
                .next()
                .unwrap_or_default()
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            out.insert(name, code);
        }
    }
    out
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

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let modules = modules();
    let known: BTreeSet<String> = modules.keys().cloned().collect();
    let edges: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|(m, code)| (m.clone(), dependencies(m, code, &known)))
        .collect();
    assert!(
        edges
            .get("provider")
            .is_some_and(|d| d.contains("domain::machine")),
        "the scan sees imports (provider uses the machine): {:?}",
        edges.get("provider")
    );
    let found = cycles(&edges);
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
    assert!(found.is_empty(), "import cycles between files: {shown:#?}");
}

#[test]
fn only_the_grpc_server_and_client_code_names_tonic() {
    let may = |m: &str| {
        [
            "grpc",
            "server",
            "tls",
            "probe",
            "pb",
            "autoscaler",
            "testkit",
        ]
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
    let must_not = [
        "provider",
        "domain",
        "cloudstack",
        "config",
        "template",
        "options",
        "metrics",
    ];
    for m in must_not {
        assert!(!may(m), "{m} is not allowed to name tonic");
    }
}
