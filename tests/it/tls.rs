//! gRPC over TLS and mutual TLS on loopback: who gets through the handshake, certificate
//! rotation without a restart, broken files during rotation, and start-up errors that name
//! the file at fault. Certificates are generated per test into a private temporary directory.

use cks_autoscaler_provider::tls::{
    ReloadOutcome, ReloadingTls, TlsError, TlsFiles, client_tls_config, incoming,
    incoming_with_timeout, load_server_config,
};
use cks_testkit::certs::{Ca, Leaf, TempDir};
use cks_testkit::{elapse, wait_until};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint, Server};
use tonic_health::ServingStatus;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus as WireStatus;
use tonic_health::pb::health_client::HealthClient;

/// Upper bound for anything that should take milliseconds; generous for a loaded machine.
const PATIENCE: Duration = Duration::from_secs(30);

/// The server's files in `dir`: server.pem, server-key.pem and, with mTLS, client-ca.pem.
fn server_files(dir: &TempDir, server: &Leaf, client_ca: Option<&Ca>) -> TlsFiles {
    TlsFiles {
        cert: dir.write("server.pem", &server.cert),
        key: dir.write("server-key.pem", &server.key),
        client_ca: client_ca.map(|ca| dir.write("client-ca.pem", &ca.pem)),
    }
}

/// Client TLS trusting `server_ca` and presenting `identity` when given.
fn client_tls(
    dir: &TempDir,
    name: &str,
    server_ca: &Ca,
    identity: Option<&Leaf>,
) -> ClientTlsConfig {
    let ca = dir.write(&format!("{name}-ca.pem"), &server_ca.pem);
    let identity = identity.map(|leaf| {
        (
            dir.write(&format!("{name}.pem"), &leaf.cert),
            dir.write(&format!("{name}-key.pem"), &leaf.key),
        )
    });
    client_tls_config(
        &ca,
        identity.as_ref().map(|(c, k)| (c.as_path(), k.as_path())),
        "localhost",
    )
    .unwrap()
}

// ---------------------------------------------------------------------------------------------
// Server and client.

struct TestServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
    _reporter: tonic_health::server::HealthReporter,
}

impl TestServer {
    async fn start(tls: ReloadingTls) -> TestServer {
        TestServer::start_with(tls, None).await
    }

    async fn start_with(tls: ReloadingTls, handshake_timeout: Option<Duration>) -> TestServer {
        cks_testkit::logs::capture();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (reporter, health) = tonic_health::server::health_reporter();
        reporter
            .set_service_status("", ServingStatus::Serving)
            .await;
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async {
            let _ = stopped.await;
        };
        let task = match handshake_timeout {
            None => tokio::spawn(
                Server::builder()
                    .add_service(health)
                    .serve_with_incoming_shutdown(incoming(listener, tls), shutdown),
            ),
            Some(timeout) => tokio::spawn(
                Server::builder()
                    .add_service(health)
                    .serve_with_incoming_shutdown(
                        incoming_with_timeout(listener, tls, timeout),
                        shutdown,
                    ),
            ),
        };
        TestServer {
            addr,
            stop: Some(stop),
            task,
            _reporter: reporter,
        }
    }

    async fn connect(&self, tls: ClientTlsConfig) -> Result<Channel, String> {
        let endpoint = Endpoint::from_shared(format!("https://127.0.0.1:{}", self.addr.port()))
            .unwrap()
            .tls_config(tls)
            .map_err(|e| format!("{e:?}"))?
            .connect_timeout(PATIENCE)
            .timeout(PATIENCE);
        // connect_timeout covers TCP only; the TLS handshake needs its own bound.
        tokio::time::timeout(PATIENCE, endpoint.connect())
            .await
            .map_err(|_| "connecting timed out".to_owned())?
            .map_err(|e| format!("{e:?}"))
    }

    /// One health check on a new connection: the status, or the error text.
    async fn check(&self, tls: ClientTlsConfig) -> Result<WireStatus, String> {
        let channel = self.connect(tls).await?;
        check_on(channel).await
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(PATIENCE, &mut self.task)
            .await
            .expect("server stops")
            .expect("server task")
            .expect("server result");
    }
}

async fn check_on(channel: Channel) -> Result<WireStatus, String> {
    let response = tokio::time::timeout(
        PATIENCE,
        HealthClient::new(channel).check(HealthCheckRequest {
            service: String::new(),
        }),
    )
    .await
    .map_err(|_| "health check timed out".to_owned())?
    .map_err(|status| format!("{status:?}"))?;
    WireStatus::try_from(response.into_inner().status).map_err(|e| format!("{e:?}"))
}

fn serving() -> Result<WireStatus, String> {
    Ok(WireStatus::Serving)
}

// ---------------------------------------------------------------------------------------------
// Tests.

#[tokio::test]
async fn mutual_tls_admits_only_clients_with_a_certificate_from_the_client_ca() {
    let dir = TempDir::new("mtls");
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let other_ca = Ca::new("some other CA");
    let files = server_files(&dir, &server_ca.server(), Some(&client_ca));
    let server =
        TestServer::start(ReloadingTls::new(files, Duration::from_secs(60)).unwrap()).await;

    let good = client_tls(
        &dir,
        "good",
        &server_ca,
        Some(&client_ca.client("cluster-autoscaler", &[])),
    );
    assert_eq!(server.check(good).await, serving());

    let anonymous = client_tls(&dir, "anonymous", &server_ca, None);
    let refused = server.check(anonymous).await.unwrap_err();
    assert!(
        refused.contains("CertificateRequired"),
        "no client certificate is refused by the handshake: {refused}"
    );

    let stranger = client_tls(
        &dir,
        "stranger",
        &server_ca,
        Some(&other_ca.client("cluster-autoscaler", &[])),
    );
    let refused = server.check(stranger).await.unwrap_err();
    assert!(
        refused.contains("UnknownCA") || refused.contains("BadCertificate"),
        "a certificate from another CA is refused by the handshake: {refused}"
    );

    // A client that speaks plaintext gRPC never gets an answer either.
    let plaintext = Endpoint::from_shared(format!("http://127.0.0.1:{}", server.addr.port()))
        .unwrap()
        .connect_timeout(PATIENCE)
        .timeout(PATIENCE);
    let result = match plaintext.connect().await {
        Ok(channel) => check_on(channel).await,
        Err(e) => Err(format!("{e:?}")),
    };
    assert!(result.is_err(), "plaintext is not served: {result:?}");

    // The refusals did not disturb the server.
    let good = client_tls(
        &dir,
        "good-again",
        &server_ca,
        Some(&client_ca.client("cluster-autoscaler", &[])),
    );
    assert_eq!(server.check(good).await, serving());
    server.stop().await;
}

#[tokio::test]
async fn without_a_client_ca_any_tls_client_is_served() {
    let dir = TempDir::new("tls");
    let server_ca = Ca::new("server CA");
    let files = server_files(&dir, &server_ca.server(), None);
    let server =
        TestServer::start(ReloadingTls::new(files, Duration::from_secs(60)).unwrap()).await;

    let anonymous = client_tls(&dir, "anonymous", &server_ca, None);
    assert_eq!(server.check(anonymous).await, serving());

    // The server must still prove who it is: a client trusting another CA refuses it.
    let other_ca = Ca::new("some other CA");
    let distrustful = client_tls(&dir, "distrustful", &other_ca, None);
    assert!(server.check(distrustful).await.is_err());
    server.stop().await;
}

#[tokio::test]
async fn a_stalled_handshake_does_not_block_other_clients() {
    let dir = TempDir::new("stall");
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let files = server_files(&dir, &server_ca.server(), Some(&client_ca));
    let tls = ReloadingTls::new(files, Duration::from_secs(60)).unwrap();
    // Longer than the client's patience: were handshakes run one after another, the good
    // client below would time out behind the silent one.
    let server = TestServer::start_with(tls, Some(PATIENCE * 4)).await;

    // Connect and never say a word.
    let _silent = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let _half_hello = {
        let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        // The start of a TLS record header, then nothing.
        tokio::io::AsyncWriteExt::write_all(&mut stream, &[0x16, 0x03, 0x01])
            .await
            .unwrap();
        stream
    };
    let good = client_tls(
        &dir,
        "good",
        &server_ca,
        Some(&client_ca.client("cluster-autoscaler", &[])),
    );
    assert_eq!(server.check(good).await, serving());
    server.stop().await;
}

#[tokio::test]
async fn a_stalled_handshake_is_closed_after_the_timeout() {
    let dir = TempDir::new("timeout");
    let server_ca = Ca::new("server CA");
    let files = server_files(&dir, &server_ca.server(), None);
    let tls = ReloadingTls::new(files, Duration::from_secs(60)).unwrap();
    let server = TestServer::start_with(tls, Some(Duration::from_millis(300))).await;

    let mut silent = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(PATIENCE, silent.read(&mut buf))
        .await
        .expect("the server closes a stalled handshake");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "connection closed: {read:?}"
    );

    // And keeps serving.
    let anonymous = client_tls(&dir, "anonymous", &server_ca, None);
    assert_eq!(server.check(anonymous).await, serving());
    server.stop().await;
}

#[tokio::test]
async fn rotated_certificates_are_served_without_a_restart() {
    let dir = TempDir::new("rotate");
    let old_ca = Ca::new("server CA 2025");
    let client_ca = Ca::new("client CA");
    let files = server_files(&dir, &old_ca.server(), Some(&client_ca));
    let tls = ReloadingTls::new(files, Duration::from_millis(50)).unwrap();
    let watcher = tls.clone();
    let server = TestServer::start(tls).await;

    let trusts_old = |name: &str| {
        client_tls(
            &dir,
            name,
            &old_ca,
            Some(&client_ca.client("cluster-autoscaler", &[])),
        )
    };
    let before = server.connect(trusts_old("before")).await.unwrap();
    assert_eq!(check_on(before.clone()).await, serving());
    assert_eq!(watcher.reloads(), 0);

    // cert-manager renews: new key, new certificate, here from a new issuer.
    let new_ca = Ca::new("server CA 2026");
    let renewed = new_ca.server();
    dir.write("server-key.pem", &renewed.key);
    dir.write("server.pem", &renewed.cert);
    wait_until("the renewed certificate to be loaded", async || {
        watcher.reloads() >= 1
    })
    .await;

    let trusts_new = client_tls(
        &dir,
        "after",
        &new_ca,
        Some(&client_ca.client("cluster-autoscaler", &[])),
    );
    assert_eq!(server.check(trusts_new).await, serving());
    let stale = server.check(trusts_old("stale")).await;
    assert!(
        stale.is_err(),
        "the old certificate is no longer presented: {stale:?}"
    );

    // A connection made before the rotation keeps working, and the server never restarted.
    assert_eq!(check_on(before).await, serving());
    assert!(!server.task.is_finished());
    server.stop().await;
}

#[tokio::test(start_paused = true)]
async fn broken_files_keep_the_previous_certificate_and_log_an_error() {
    let dir = TempDir::new("garbage");
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let files = server_files(&dir, &server_ca.server(), Some(&client_ca));
    let cert_path = files.cert.clone();
    let tls = ReloadingTls::new(files, Duration::from_millis(50)).unwrap();
    let watcher = tls.clone();
    let server = TestServer::start(tls).await;

    dir.write("server.pem", "this is not a certificate\n");
    wait_until("the broken file to be noticed", async || {
        watcher.failed_reloads() >= 1
    })
    .await;

    let good = client_tls(
        &dir,
        "good",
        &server_ca,
        Some(&client_ca.client("cluster-autoscaler", &[])),
    );
    assert_eq!(server.check(good).await, serving());
    assert_eq!(watcher.reloads(), 0);
    let errors: Vec<_> = cks_testkit::logs::lines_mentioning(&cert_path.display().to_string())
        .into_iter()
        .filter(|line| line.contains("ERROR"))
        .collect();
    assert!(
        errors
            .iter()
            .any(|line| line.contains("not PEM") && line.contains("previous")),
        "an error names the broken file: {errors:?}"
    );

    // Broken files stay broken for many checks: reported once, not every interval. A span
    // (the assertion is that nothing more happens in it): on paused time, six 50 ms check
    // intervals all pass.
    elapse(Duration::from_millis(300)).await;
    assert_eq!(watcher.failed_reloads(), 1);

    // Once fixed, the new certificate is picked up.
    let fixed = server_ca.server();
    dir.write("server-key.pem", &fixed.key);
    dir.write("server.pem", &fixed.cert);
    wait_until("the fixed certificate to be loaded", async || {
        watcher.reloads() >= 1
    })
    .await;
    let good = client_tls(
        &dir,
        "good-again",
        &server_ca,
        Some(&client_ca.client("cluster-autoscaler", &[])),
    );
    assert_eq!(server.check(good).await, serving());
    server.stop().await;
}

#[test]
fn load_errors_name_the_bad_file() {
    let dir = TempDir::new("errors");
    let ca = Ca::new("server CA");
    let server = ca.server();
    let other = ca.server();
    let cert = dir.write("server.pem", &server.cert);
    let key = dir.write("server-key.pem", &server.key);
    let client_ca = dir.write("client-ca.pem", &ca.pem);
    let files = |cert: &Path, key: &Path, client_ca: Option<&Path>| TlsFiles {
        cert: cert.to_owned(),
        key: key.to_owned(),
        client_ca: client_ca.map(Path::to_owned),
    };
    let error = |files: TlsFiles| load_server_config(&files).unwrap_err();
    let shows = |e: &TlsError, path: &Path| e.to_string().contains(&path.display().to_string());

    // The good set loads, with and without a client CA, and offers HTTP/2.
    let config = load_server_config(&files(&cert, &key, Some(&client_ca))).unwrap();
    assert_eq!(config.alpn_protocols, vec![b"h2".to_vec()]);
    load_server_config(&files(&cert, &key, None)).unwrap();

    let missing = dir.path("absent.pem");
    let e = error(files(&missing, &key, None));
    assert!(
        matches!(e, TlsError::Read { .. }) && shows(&e, &missing),
        "{e}"
    );
    let e = error(files(&cert, &missing, None));
    assert!(
        matches!(e, TlsError::Read { .. }) && shows(&e, &missing),
        "{e}"
    );
    let e = error(files(&cert, &key, Some(&missing)));
    assert!(
        matches!(e, TlsError::Read { .. }) && shows(&e, &missing),
        "{e}"
    );

    let garbage = dir.write("garbage.pem", "hello\n");
    let e = error(files(&garbage, &key, None));
    assert!(
        matches!(e, TlsError::NotPem { .. }) && shows(&e, &garbage),
        "{e}"
    );
    let empty = dir.write("empty.pem", "");
    let e = error(files(&cert, &empty, None));
    assert!(
        matches!(e, TlsError::NotPem { .. }) && shows(&e, &empty),
        "{e}"
    );
    assert!(e.to_string().contains("empty"), "{e}");
    let truncated = dir.write("truncated.pem", &server.cert[..server.cert.len() / 2]);
    let e = error(files(&truncated, &key, None));
    assert!(
        matches!(e, TlsError::NotPem { .. }) && shows(&e, &truncated),
        "{e}"
    );

    // The certificate and key files swapped.
    let e = error(files(&key, &cert, None));
    assert!(
        matches!(e, TlsError::NoCertificate { .. }) && shows(&e, &key),
        "{e}"
    );
    let e = error(files(&cert, &cert, None));
    assert!(
        matches!(e, TlsError::NoPrivateKey { .. }) && shows(&e, &cert),
        "{e}"
    );

    let other_key = dir.write("other-key.pem", &other.key);
    let e = error(files(&cert, &other_key, None));
    assert!(
        matches!(e, TlsError::KeyMismatch { .. }) && shows(&e, &cert) && shows(&e, &other_key),
        "{e}"
    );

    let e = error(files(&cert, &key, Some(&garbage)));
    assert!(
        shows(&e, &garbage) && e.to_string().contains("client CA"),
        "{e}"
    );
    let e = error(files(&cert, &key, Some(&key)));
    assert!(
        matches!(e, TlsError::NoCertificate { .. }) && shows(&e, &key),
        "{e}"
    );

    // The reloading wrapper fails fast the same way.
    let e = ReloadingTls::new(files(&cert, &other_key, None), Duration::from_secs(1)).unwrap_err();
    assert!(matches!(e, TlsError::KeyMismatch { .. }), "{e}");

    // So does the client side.
    let e = client_tls_config(&missing, None, "localhost").unwrap_err();
    assert!(shows(&e, &missing), "{e}");
    let e = client_tls_config(&client_ca, Some((&cert, &other_key)), "localhost").unwrap_err();
    assert!(matches!(e, TlsError::KeyMismatch { .. }), "{e}");
    client_tls_config(&client_ca, Some((&cert, &key)), "localhost").unwrap();
}

#[test]
fn check_now_reports_what_it_did_and_only_swaps_on_success() {
    let dir = TempDir::new("check-now");
    let ca = Ca::new("server CA");
    let files = server_files(&dir, &ca.server(), None);
    // Far longer than the test: only explicit checks look at the files.
    let tls = ReloadingTls::new(files, Duration::from_secs(3600)).unwrap();
    let first = tls.current();
    assert_eq!(tls.check_now(), ReloadOutcome::Unchanged);
    assert!(Arc::ptr_eq(&first, &tls.current()));

    let renewed = ca.server();
    dir.write("server-key.pem", &renewed.key);
    assert_eq!(
        tls.check_now(),
        ReloadOutcome::Failed,
        "new key, old certificate"
    );
    assert!(Arc::ptr_eq(&first, &tls.current()));
    dir.write("server.pem", &renewed.cert);
    assert_eq!(tls.check_now(), ReloadOutcome::Reloaded);
    let second = tls.current();
    assert!(!Arc::ptr_eq(&first, &second));
    assert_eq!((tls.reloads(), tls.failed_reloads()), (1, 1));

    std::fs::remove_file(dir.path("server.pem")).unwrap();
    assert_eq!(
        tls.check_now(),
        ReloadOutcome::Failed,
        "certificate file gone"
    );
    assert_eq!(tls.check_now(), ReloadOutcome::Failed);
    assert!(Arc::ptr_eq(&second, &tls.current()));
    assert_eq!(
        (tls.reloads(), tls.failed_reloads()),
        (1, 2),
        "a lasting failure counts once"
    );
}

/// The value of one counter series on a metrics page (0 when absent).
fn counter(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// The provider's lines about refused handshakes on `server`'s listener for `reason`.
fn refusal_lines(server: &TestServer, reason: &str) -> Vec<String> {
    cks_testkit::logs::lines_mentioning(&format!("listener=127.0.0.1:{}", server.addr.port()))
        .into_iter()
        .filter(|l| {
            l.contains("refused a TLS handshake") && l.contains(&format!("reason=\"{reason}\""))
        })
        .collect()
}

/// Each TLS mistake a client can make is refused by the handshake and, on the provider's
/// side, counted and logged with its reason and fix (the client's side shows the error the
/// guide's troubleshooting table lists); a client retrying the same mistake leaves at most one
/// line a minute, the metric counting every try.
#[tokio::test]
async fn refused_handshakes_are_logged_with_the_reason_at_most_once_a_minute_and_counted() {
    let metrics = cks_autoscaler_provider::metrics::install();
    let dir = TempDir::new("refusals");
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let files = server_files(&dir, &server_ca.server(), Some(&client_ca));
    let server =
        TestServer::start(ReloadingTls::new(files, Duration::from_secs(60)).unwrap()).await;
    let series =
        |reason: &str| format!("cks_provider_tls_handshakes_refused_total{{reason=\"{reason}\"}}");
    let before = metrics.render();

    // (client's TLS, what the client's error holds, the provider's reason)
    let cases = [
        (
            client_tls(&dir, "anonymous", &server_ca, None),
            "CertificateRequired",
            "no_client_certificate",
        ),
        (
            client_tls(
                &dir,
                "stranger",
                &server_ca,
                Some(&Ca::new("some other CA").client("cluster-autoscaler", &[])),
            ),
            "UnknownCA",
            "unknown_ca",
        ),
        (
            // A CA created again under the client CA's name: the issuer is found by name, the
            // signature does not verify.
            client_tls(
                &dir,
                "same-name",
                &server_ca,
                Some(&Ca::new("client CA").client("cluster-autoscaler", &[])),
            ),
            "DecryptError",
            "bad_signature",
        ),
        (
            client_tls(
                &dir,
                "expired",
                &server_ca,
                Some(&client_ca.client_expiring("cluster-autoscaler", 2021, 1, 1)),
            ),
            "CertificateExpired",
            "expired",
        ),
        (
            // The client does not trust the provider's certificate.
            client_tls(
                &dir,
                "distrustful",
                &Ca::new("another server CA"),
                Some(&client_ca.client("cluster-autoscaler", &[])),
            ),
            "UnknownIssuer",
            "client_refused_server_certificate",
        ),
    ];
    for (tls, client_sees, reason) in cases {
        let refused = server.check(tls).await.unwrap_err();
        assert!(
            refused.contains(client_sees),
            "{reason}: the client sees {refused}"
        );
        wait_until(&format!("a line for {reason}"), async || {
            !refusal_lines(&server, reason).is_empty()
        })
        .await;
        let line = refusal_lines(&server, reason).remove(0);
        assert!(
            line.contains("WARN") && line.contains("peer=127.0.0.1"),
            "{line}"
        );
    }
    assert!(
        refusal_lines(&server, "unknown_ca")[0]
            .contains("issue it from that CA, or add its CA to the --tls-client-ca file")
    );

    // A client speaking plain text on the TLS port.
    let plaintext = Endpoint::from_shared(format!("http://127.0.0.1:{}", server.addr.port()))
        .unwrap()
        .connect_timeout(PATIENCE)
        .timeout(PATIENCE);
    if let Ok(channel) = plaintext.connect().await {
        assert!(check_on(channel).await.is_err(), "plaintext is not served");
    }
    wait_until("a line for plain text", async || {
        !refusal_lines(&server, "plain_text").is_empty()
    })
    .await;

    // The same mistake again and again: counted every time, logged at most once a minute.
    let tries = 4;
    for i in 0..tries {
        let stranger = client_tls(
            &dir,
            &format!("stranger-{i}"),
            &server_ca,
            Some(&Ca::new("some other CA").client("cluster-autoscaler", &[])),
        );
        assert!(server.check(stranger).await.is_err());
    }
    wait_until("every refusal counted", async || {
        counter(&metrics.render(), &series("unknown_ca"))
            >= counter(&before, &series("unknown_ca")) + f64::from(tries + 1)
    })
    .await;
    let lines = refusal_lines(&server, "unknown_ca");
    assert!(
        !lines.is_empty() && lines.len() < usize::try_from(tries + 1).unwrap(),
        "at most one line a minute: {lines:#?}"
    );
    // The listener still serves.
    let good = client_tls(
        &dir,
        "good",
        &server_ca,
        Some(&client_ca.client("cluster-autoscaler", &[])),
    );
    assert_eq!(server.check(good).await, serving());
    server.stop().await;
}
