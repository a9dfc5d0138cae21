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

/// The `src/` of every crate of the workspace: the provider's and each one under `crates/`.
fn crate_sources() -> Vec<(String, PathBuf)> {
    let mut out = vec![("cks-autoscaler-provider".to_string(), root().join("src"))];
    for entry in std::fs::read_dir(root().join("crates")).expect("crates/") {
        let dir = entry.expect("entry").path();
        let name = format!("cks-{}", dir.file_name().expect("name").to_string_lossy());
        out.push((name, dir.join("src")));
    }
    out.sort();
    out
}

/// Module path (`provider::ops`) → source without comments and `#[cfg(test)] mod tests`.
fn modules() -> BTreeMap<String, String> {
    modules_of(&root().join("src"))
}

fn modules_of(src: &Path) -> BTreeMap<String, String> {
    let src = src.to_path_buf();
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
    for fixture in ["cks-sim", "cks-lab", "cks-testkit"] {
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
/// Longest a source file may be outside its test module: what a reader can hold.
const MAX_LINES: usize = 800;

#[test]
fn no_source_file_is_longer_than_a_reader_can_hold() {
    let mut long = Vec::new();
    for (name, src) in crate_sources() {
        let mut stack = vec![src];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("read dir") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    // `tests/` directories of a module hold its tests.
                    if path.file_name().is_some_and(|n| n != "tests") {
                        stack.push(path);
                    }
                    continue;
                }
                let is_tests = path.file_name().is_some_and(|n| n == "tests.rs");
                if path.extension().is_none_or(|e| e != "rs") || is_tests {
                    continue;
                }
                let text = std::fs::read_to_string(&path).expect("read");
                let code = text
                    .split("#[cfg(test)]\nmod tests")
                    .next()
                    .unwrap_or_default();
                let lines = code.lines().count();
                if lines > MAX_LINES {
                    long.push(format!("{name}: {} ({lines} lines)", path.display()));
                }
            }
        }
    }
    assert!(
        long.is_empty(),
        "source files over {MAX_LINES} lines without their tests: {long:#?}"
    );
}
