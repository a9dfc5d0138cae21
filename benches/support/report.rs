//! What every benchmark shares, with nothing but std: command-line switches, latency
//! statistics, the machine's line and the table writer that updates docs/benchmarks.md between
//! markers. A crate's own benchmark (crates/domain/benches) includes this file with `#[path]`;
//! the root package's get it through `support`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Switches after `--` on `cargo bench --bench NAME -- ...`.
#[derive(Debug, Clone, Copy, Default)]
pub struct BenchArgs {
    /// `--write`: replace this benchmark's section of docs/benchmarks.md.
    pub write: bool,
    /// `--quick`: shorter windows and smaller clusters, for a smoke run.
    pub quick: bool,
}

impl BenchArgs {
    pub fn parse() -> Self {
        let mut a = BenchArgs::default();
        // `cargo test --all-targets` runs bench binaries without `--bench`: measurements
        // belong to `cargo bench`, so a test run only says how to run them.
        if !std::env::args().any(|a| a == "--bench") {
            println!(
                "benchmark skipped under `cargo test`; run it with `cargo bench --bench <name>`"
            );
            std::process::exit(0);
        }
        for arg in std::env::args().skip(1) {
            match arg.as_str() {
                "--write" => a.write = true,
                "--quick" => a.quick = true,
                // cargo passes --bench to harness=false targets; filters are not supported.
                "--bench" => {}
                other => eprintln!("ignoring unknown argument {other:?} (known: --write, --quick)"),
            }
        }
        a
    }
}

/// Latency percentiles of one measurement (nearest-rank on the sorted samples).
#[derive(Debug, Clone, Copy, Default)]
pub struct Latency {
    pub n: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub mean: Duration,
}

impl Latency {
    pub fn of(samples: &mut [Duration]) -> Self {
        if samples.is_empty() {
            return Latency::default();
        }
        samples.sort_unstable();
        let n = samples.len();
        let rank = |q: f64| samples[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
        let total: Duration = samples.iter().sum();
        Latency {
            n,
            p50: rank(0.50),
            p99: rank(0.99),
            max: samples[n - 1],
            mean: total / u32::try_from(n).unwrap_or(u32::MAX),
        }
    }
}

/// `123 µs`, `4.56 ms` or `7.89 s`.
pub fn fmt_dur(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1_000.0 {
        format!("{us:.0} µs")
    } else if us < 1_000_000.0 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

/// `12.3 MiB` from KiB.
pub fn fmt_mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// A Markdown table.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn markdown(&self) -> String {
        let mut out = format!("| {} |\n", self.header.join(" | "));
        out.push_str(&format!(
            "|{}\n",
            self.header.iter().map(|_| "---|").collect::<String>()
        ));
        for r in &self.rows {
            out.push_str(&format!("| {} |\n", r.join(" | ")));
        }
        out
    }
}

/// The machine the numbers come from, in one line.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into());
    format!("{cpus} CPUs ({model}), 1-min load average {load} at start")
}

/// docs/benchmarks.md of the workspace, from the root package's benchmarks and from a crate's
/// under crates/ alike (this file is shared by both).
pub fn docs_path() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .map(|dir| dir.join("docs/benchmarks.md"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| manifest.join("docs/benchmarks.md"))
}

/// Prints `body` and, with `--write`, puts it between `<!-- bench:NAME:begin -->` and
/// `<!-- bench:NAME:end -->` in docs/benchmarks.md (appending the markers when absent).
pub fn report(args: BenchArgs, name: &str, body: &str) {
    println!("{body}");
    if !args.write {
        println!("(run with `-- --write` to put this into docs/benchmarks.md)");
        return;
    }
    let path = docs_path();
    let begin = format!("<!-- bench:{name}:begin -->");
    let end = format!("<!-- bench:{name}:end -->");
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let section = format!("{begin}\n{}\n{end}", body.trim_end());
    let updated = match (text.find(&begin), text.find(&end)) {
        (Some(b), Some(e)) if b < e => {
            format!("{}{}{}", &text[..b], section, &text[e + end.len()..])
        }
        _ => format!("{}\n{section}\n", text.trim_end()),
    };
    match std::fs::write(&path, updated) {
        Ok(()) => println!("updated {}", path.display()),
        Err(e) => eprintln!("could not write {}: {e}", path.display()),
    }
}
