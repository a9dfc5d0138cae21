//! Certificates an operator makes without cert-manager, used for real: the operations guide's
//! openssl commands (§5.4) and `components/own-certificates/renew.sh` issue a server certificate
//! that names `localhost` and the provider's Service names and chains to the operator's CA; a
//! provider serving those files is reached by `probe` through `localhost`, as after a
//! `kubectl port-forward`; and `probe` shows the certificate it was presented, with its expiry.
//!
//! The openssl tests need an `openssl` binary and fail naming it when there is none. Time: the probe
//! runs as a child process with its own clock, so these tests keep the wall clock and wait on
//! its exit (bounded).

use cks_autoscaler_provider::server::ServeOptions;
use cks_autoscaler_provider::tls::{DEFAULT_CHECK_INTERVAL, ReloadingTls, TlsFiles};
use cks_autoscaler_provider::x509;
use cks_sim::{self as sim, SimConfig};
use cks_testkit::certs::{Ca, TempDir};
use cks_testkit::{ProviderServer, fast_settings, loopback};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `script` with `sh` in `dir`, with `stubs` (name, shell body) first on `PATH` in
/// `dir/bin`, and asserts that it succeeded.
pub(crate) fn sh_with_stubs(
    dir: &Path,
    stubs: &[(&str, &str)],
    script: &str,
    args: &[&str],
) -> Output {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("stand-in directory");
    for (name, body) in stubs {
        let path = bin.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("stand-in");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .args(args)
        .current_dir(dir)
        .env("PATH", path)
        .stdin(Stdio::null())
        .output()
        .expect("sh runs");
    assert!(
        out.status.success(),
        "the commands failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `script` with `sh` in `dir`, with a `kubectl` that only succeeds (no cluster here).
fn sh_in(dir: &Path, script: &str, args: &[&str]) -> Output {
    sh_with_stubs(
        dir,
        &[("kubectl", "cat >/dev/null 2>&1 || true\nexit 0")],
        script,
        args,
    )
}

/// The shell block of the guide's "Without cert-manager" section.
fn documented_commands() -> String {
    let guide = std::fs::read_to_string(repo().join("docs/operations.md")).expect("guide");
    let (_, section) = guide
        .split_once("### 5.4 Without cert-manager")
        .expect("§5.4");
    let (_, rest) = section.split_once("```sh\n").expect("a shell block");
    rest.split_once("```").expect("its end").0.to_string()
}

/// The names of the server certificate in `pem_path`, read as probe reads them.
fn server_names(pem_path: &Path) -> Vec<String> {
    let pem = std::fs::read(pem_path).expect("certificate");
    use rustls::pki_types::pem::PemObject;
    let der = rustls::pki_types::CertificateDer::from_pem_slice(&pem).expect("PEM");
    x509::summarize(&der).expect("X.509").names()
}

const SERVICE_NAMES: [&str; 4] = [
    "cks-autoscaler-provider",
    "cks-autoscaler-provider.kube-system",
    "cks-autoscaler-provider.kube-system.svc",
    "cks-autoscaler-provider.kube-system.svc.cluster.local",
];

/// Runs the binary's `probe` against `port` on `localhost`, trusting `ca`, presenting the
/// client certificate and key when given.
pub(crate) async fn probe_localhost(
    port: u16,
    ca: &Path,
    client: Option<(&Path, &Path)>,
) -> Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_cks-autoscaler-provider"));
    for (k, _) in std::env::vars() {
        if k.starts_with("CKS_PROBE_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    let address = format!("localhost:{port}");
    cmd.args([
        "probe",
        "--address",
        &address,
        "--timeout",
        "20s",
        "--cacert",
    ])
    .arg(ca);
    if let Some((cert, key)) = client {
        cmd.arg("--cert").arg(cert).arg("--key").arg(key);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = cmd.spawn().expect("probe runs");
    tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("probe ends within a minute")
        .expect("its output")
}

/// A provider for `sim` on loopback serving with mutual TLS from these files.
async fn provider_with(sim: &sim::SimHandle, cluster: &str, files: TlsFiles) -> ProviderServer {
    let tls = ReloadingTls::new(files, DEFAULT_CHECK_INTERVAL).expect("the files load");
    let options = ServeOptions {
        tls: Some(tls),
        ..ServeOptions::default()
    };
    ProviderServer::start(sim, fast_settings(cluster, 1, 10), loopback(), options).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_and_renewed_certificates_serve_probe_through_localhost() {
    cks_testkit::tools::openssl().unwrap_or_else(|e| panic!("{e}"));
    let dir = TempDir::new("own-certs");
    let root = dir.path("");
    // The guide's commands, as written: the CA, both leaves, both Secrets.
    sh_in(&root, &documented_commands(), &[]);
    // The script, from that CA: new leaves kept in renewed/.
    let script = repo().join("deploy/kustomize/components/own-certificates/renew.sh");
    sh_in(
        &root,
        &format!("exec sh '{}' \"$@\"", script.display()),
        &[
            "--ca-cert",
            "ca.crt",
            "--ca-key",
            "ca.key",
            "--out",
            "renewed",
            "--no-apply",
        ],
    );
    let renewed = root.join("renewed");
    for (what, server, client, key) in [
        (
            "documented",
            root.join("server.crt"),
            root.join("client.crt"),
            root.join("client.key"),
        ),
        (
            "renewed",
            renewed.join("server.crt"),
            renewed.join("client.crt"),
            renewed.join("client.key"),
        ),
    ] {
        let names = server_names(&server);
        for want in SERVICE_NAMES.iter().chain(&["localhost"]) {
            assert!(
                names.iter().any(|n| n == want),
                "{what}: {want} missing from {names:?}"
            );
        }
        // The client certificate names the autoscaler, the identity `--nodes …@CLIENT` binds.
        assert_eq!(server_names(&client), ["cks-cluster-autoscaler"], "{what}");

        let sim = sim::spawn(SimConfig::default()).await.expect("simulator");
        let cluster = sim.cluster_ids().into_iter().next().expect("a cluster");
        let server_key = server.with_extension("key");
        let mut provider = provider_with(
            &sim,
            &cluster,
            TlsFiles {
                cert: server.clone(),
                key: server_key,
                client_ca: Some(root.join("ca.crt")),
            },
        )
        .await;
        let out = probe_localhost(
            provider.addr.port(),
            &root.join("ca.crt"),
            Some((&client, &key)),
        )
        .await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{what}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains(&format!("node group {cluster}")),
            "{what}: {stdout}"
        );
        assert!(
            stdout.contains(
                "Server certificate (checked as localhost): names cks-autoscaler-provider, "
            ),
            "{what}: {stdout}"
        );
        provider.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_shows_when_the_server_certificate_expires() {
    let ca = Ca::new("probe expiry CA");
    let server = ca.server_expiring(2043, 7, 9);
    let client = ca.client("cks-cluster-autoscaler", &["cks-cluster-autoscaler"]);
    let dir = TempDir::new("probe-expiry");
    let files = TlsFiles {
        cert: dir.write("tls.crt", &server.cert),
        key: dir.write("tls.key", &server.key),
        client_ca: Some(dir.write("ca.crt", &ca.pem)),
    };
    let cert = dir.write("client.crt", &client.cert);
    let key = dir.write("client.key", &client.key);
    let sim = sim::spawn(SimConfig::default()).await.expect("simulator");
    let cluster = sim.cluster_ids().into_iter().next().expect("a cluster");
    let mut provider = provider_with(&sim, &cluster, files).await;
    let out = probe_localhost(
        provider.addr.port(),
        &dir.path("ca.crt"),
        Some((&cert, &key)),
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("Server certificate (checked as localhost): names localhost, 127.0.0.1 (CN cks-autoscaler-provider)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  expires 2043-07-09 00:00:00 UTC (in "),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("node group {cluster}")),
        "{stdout}"
    );
    provider.stop().await;
}
