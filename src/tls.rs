//! gRPC TLS and mutual TLS for the provider's listener, with certificates re-read from disk.
//!
//! This module owns everything between an accepted TCP connection and a TLS stream that tonic
//! serves: reading and validating the PEM files (`--tls-cert`, `--tls-key`, `--tls-client-ca`),
//! building the rustls [`ServerConfig`], noticing when the files change (cert-manager rotates
//! them in place) and swapping the configuration without a restart, and running handshakes
//! concurrently so that one slow or hostile client never stalls the accept loop.
//!
//! * [`load_server_config`] validates the files once and fails fast with an error naming the
//!   file and what is wrong with it.
//! * [`ReloadingTls`] holds the configuration in use and re-reads the files at most every
//!   check interval. New files that do not load are logged and ignored: the previous
//!   configuration keeps serving, the listener never falls back to plaintext.
//! * [`incoming`] turns a [`TcpListener`] into the stream that tonic's
//!   `serve_with_incoming_shutdown` takes. Connections already established keep the
//!   certificate they were opened with; new ones get the current configuration.
//!
//! With a client CA, the client certificate is required and verified during the handshake, so a
//! client without a valid certificate never reaches a gRPC handler. [`certificate_identities`]
//! reads the names a verified client certificate carries, which `--nodes …@CLIENT` binds
//! groups to. The crypto provider is
//! aws-lc-rs, the one tonic's `tls-aws-lc` feature uses; server configurations name it
//! explicitly so they never depend on the process-wide default.

mod refusal;

use refusal::note_refusal;
pub use refusal::{REFUSAL_LOG_PAIRS, REFUSAL_LOG_WINDOW, Refusal, RefusalLog};

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;

/// How often the files are re-read when the caller has no better value. cert-manager renews
/// well before expiry, so a short delay in picking up a new certificate costs nothing.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// A client that has not finished its handshake by then is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes in flight at once. Past this the accept loop stops accepting until one ends, so
/// a flood of stalled connections waits in the kernel backlog instead of growing memory.
const MAX_PENDING_HANDSHAKES: usize = 1024;

/// ALPN protocol gRPC runs on.
const ALPN_H2: &[u8] = b"h2";

/// The PEM files the server's TLS is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Server certificate chain, leaf first.
    pub cert: PathBuf,
    /// Private key of the leaf certificate (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA bundle client certificates must chain to. `Some` turns on mutual TLS: clients
    /// without a valid certificate are refused during the handshake.
    pub client_ca: Option<PathBuf>,
}

/// Why TLS files could not be used. Every variant names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// (The cause is in the message, not a `source`: a chain printed whole says it once.)
    #[error("cannot read {what} file {}: {cause}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        cause: io::Error,
    },
    #[error("{what} file {} is not PEM: {detail}", path.display())]
    NotPem {
        what: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error(
        "{what} file {} contains no certificate (expected a '-----BEGIN CERTIFICATE-----' block)",
        path.display()
    )]
    NoCertificate { what: &'static str, path: PathBuf },
    #[error("{what} file {} holds a certificate that cannot be parsed: {detail}", path.display())]
    BadCertificate {
        what: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error(
        "{what} file {} contains no private key (expected a '-----BEGIN PRIVATE KEY-----', \
         'RSA PRIVATE KEY' or 'EC PRIVATE KEY' block)",
        path.display()
    )]
    NoPrivateKey { what: &'static str, path: PathBuf },
    #[error("{what} file {} holds a private key that cannot be used: {detail}", path.display())]
    BadPrivateKey {
        what: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error(
        "private key in {} does not match the certificate in {}",
        key.display(),
        cert.display()
    )]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    #[error("client CA file {}: {detail}", path.display())]
    BadClientCa { path: PathBuf, detail: String },
    #[error("TLS configuration from {} and {} rejected: {detail}", cert.display(), key.display())]
    Config {
        cert: PathBuf,
        key: PathBuf,
        detail: String,
    },
}

/// Installs aws-lc-rs as the process-wide rustls crypto provider unless one is installed
/// already. Code that builds rustls configurations without naming a provider (tonic's client,
/// reqwest) relies on it; call it early in `main`.
pub fn ensure_crypto_provider() {
    // Err only means another provider won the race or was installed first; either is fine.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .clone()
}

/// Loads and validates the files now, so a bad path or a mismatched key stops the server at
/// start rather than at the first client. The configuration offers ALPN `h2` and, when
/// `files.client_ca` is set, requires a client certificate that chains to it.
pub fn load_server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    build_server_config(files, &FileContents::read(files)?)
}

/// The raw bytes of the files, read together so that a check compares one snapshot.
struct FileContents {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl FileContents {
    fn read(files: &TlsFiles) -> Result<Self, TlsError> {
        Ok(FileContents {
            cert: read_file("certificate", &files.cert)?,
            key: read_file("private key", &files.key)?,
            client_ca: files
                .client_ca
                .as_deref()
                .map(|path| read_file("client CA", path))
                .transpose()?,
        })
    }

    /// A digest to tell whether the files changed, so no second copy of the private key is
    /// kept around. Collisions would need someone who can already write the key file.
    fn digest(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        self.cert.hash(&mut hasher);
        self.key.hash(&mut hasher);
        self.client_ca.hash(&mut hasher);
        hasher.finish()
    }
}

fn read_file(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|cause| TlsError::Read {
        what,
        path: path.to_owned(),
        cause,
    })
}

fn build_server_config(
    files: &TlsFiles,
    contents: &FileContents,
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = provider();
    let certified = certified_key(
        ("certificate", &files.cert, &contents.cert),
        ("private key", &files.key, &contents.key),
        &provider,
    )?;
    let config_error = |detail: String| TlsError::Config {
        cert: files.cert.clone(),
        key: files.key.clone(),
        detail,
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| config_error(e.to_string()))?;
    let builder = match (&files.client_ca, &contents.client_ca) {
        (Some(path), Some(pem)) => {
            let bad_ca = |detail: String| TlsError::BadClientCa {
                path: path.clone(),
                detail,
            };
            let mut roots = RootCertStore::empty();
            for cert in parse_certs("client CA", path, pem)? {
                roots
                    .add(cert)
                    .map_err(|e| bad_ca(format!("not a usable CA certificate: {e}")))?;
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| bad_ca(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}

/// Parses a certificate chain and its key and checks that they belong together.
fn certified_key(
    (cert_what, cert_path, cert_pem): (&'static str, &Path, &[u8]),
    (key_what, key_path, key_pem): (&'static str, &Path, &[u8]),
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain = parse_certs(cert_what, cert_path, cert_pem)?;
    let key = parse_key(key_what, key_path, key_pem)?;
    let signing_key =
        provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| TlsError::BadPrivateKey {
                what: key_what,
                path: key_path.to_owned(),
                detail: e.to_string(),
            })?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        // Some key types cannot report their public key; rustls itself accepts those.
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(certified)
        }
        Err(rustls::Error::InconsistentKeys(_)) => Err(TlsError::KeyMismatch {
            cert: cert_path.to_owned(),
            key: key_path.to_owned(),
        }),
        Err(e) => Err(TlsError::BadCertificate {
            what: cert_what,
            path: cert_path.to_owned(),
            detail: e.to_string(),
        }),
    }
}

fn parse_certs(
    what: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    check_pem_text(what, path, pem)?;
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::NotPem {
            what,
            path: path.to_owned(),
            detail: pem_error(&e),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            what,
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

fn parse_key(
    what: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<PrivateKeyDer<'static>, TlsError> {
    check_pem_text(what, path, pem)?;
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsError::NoPrivateKey {
            what,
            path: path.to_owned(),
        },
        e => TlsError::NotPem {
            what,
            path: path.to_owned(),
            detail: pem_error(&e),
        },
    })
}

/// Rejects the commonest mistakes (an empty file, DER instead of PEM) with a plain message
/// before the PEM parser reports them as "no items found".
fn check_pem_text(what: &'static str, path: &Path, pem: &[u8]) -> Result<(), TlsError> {
    let detail = if pem.iter().all(u8::is_ascii_whitespace) {
        "the file is empty"
    } else if !pem
        .windows(b"-----BEGIN ".len())
        .any(|w| w == b"-----BEGIN ")
    {
        "no '-----BEGIN ...-----' line found"
    } else {
        return Ok(());
    };
    Err(TlsError::NotPem {
        what,
        path: path.to_owned(),
        detail: detail.to_owned(),
    })
}

fn pem_error(e: &pem::Error) -> String {
    match e {
        pem::Error::MissingSectionEnd { end_marker } => {
            format!("missing '{}' line", String::from_utf8_lossy(end_marker))
        }
        pem::Error::IllegalSectionStart { line } => {
            format!("malformed line '{}'", String::from_utf8_lossy(line))
        }
        other => other.to_string(),
    }
}

/// The server's TLS configuration, re-read from its files when they change.
///
/// Cloning is cheap and every clone shares the same state, so one clone can be handed to
/// [`incoming`] while another reports [`reloads`](Self::reloads).
#[derive(Clone)]
pub struct ReloadingTls {
    inner: Arc<Inner>,
}

struct Inner {
    files: TlsFiles,
    check_interval: Duration,
    /// Read for every handshake, written only by a successful reload. A std lock: it is never
    /// held across an await and only guards an `Arc` clone.
    current: RwLock<Arc<ServerConfig>>,
    /// Serialises file checks. Taken with `try_lock`, so a handshake never waits on another
    /// task's file reads; it uses the current configuration instead.
    check: Mutex<CheckState>,
    reloads: AtomicU64,
    failed_reloads: AtomicU64,
}

struct CheckState {
    last_check: Instant,
    /// Digest of the files the current configuration was built from.
    loaded: u64,
    /// The last failure logged, so a file that stays broken is reported once, not every check.
    last_failure: Option<(Option<u64>, String)>,
}

impl std::fmt::Debug for ReloadingTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingTls")
            .field("files", &self.inner.files)
            .field("check_interval", &self.inner.check_interval)
            .field("reloads", &self.reloads())
            .finish_non_exhaustive()
    }
}

/// What one look at the files found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// The files are as they were.
    Unchanged,
    /// The files changed and the new configuration is in use.
    Reloaded,
    /// The files changed but do not load; the previous configuration stays in use.
    Failed,
}

impl ReloadingTls {
    /// Loads the files now (failing fast like [`load_server_config`]); afterwards they are
    /// re-read at most every `check_interval`.
    pub fn new(files: TlsFiles, check_interval: Duration) -> Result<Self, TlsError> {
        let contents = FileContents::read(&files)?;
        let config = build_server_config(&files, &contents)?;
        Ok(ReloadingTls {
            inner: Arc::new(Inner {
                files,
                check_interval,
                current: RwLock::new(config),
                check: Mutex::new(CheckState {
                    last_check: Instant::now(),
                    loaded: contents.digest(),
                    last_failure: None,
                }),
                reloads: AtomicU64::new(0),
                failed_reloads: AtomicU64::new(0),
            }),
        })
    }

    /// The configuration new connections get.
    pub fn current(&self) -> Arc<ServerConfig> {
        // A poisoned lock still holds a complete Arc: the writer only swaps it.
        self.inner
            .current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// How many times changed files were loaded and put in use.
    pub fn reloads(&self) -> u64 {
        self.inner.reloads.load(Ordering::Relaxed)
    }

    /// How many distinct changes to the files could not be loaded (each also logged as an
    /// error). The previous configuration stayed in use each time.
    pub fn failed_reloads(&self) -> u64 {
        self.inner.failed_reloads.load(Ordering::Relaxed)
    }

    /// The files this configuration is read from.
    pub fn files(&self) -> &TlsFiles {
        &self.inner.files
    }

    /// The minimum time between two looks at the files.
    pub fn check_interval(&self) -> Duration {
        self.inner.check_interval
    }

    /// Looks at the files now, whatever the interval, and reloads them if they changed. For a
    /// caller that knows they changed (a SIGHUP handler, say). Failures are logged as by the
    /// periodic check.
    pub fn check_now(&self) -> ReloadOutcome {
        let mut state = self
            .inner
            .check
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.check_locked(&mut state)
    }

    /// Looks at the files if the check interval has passed and no other task is looking.
    fn check_if_due(&self) {
        let Ok(mut state) = self.inner.check.try_lock() else {
            return;
        };
        if state.last_check.elapsed() >= self.inner.check_interval {
            self.check_locked(&mut state);
        }
    }

    fn check_locked(&self, state: &mut CheckState) -> ReloadOutcome {
        state.last_check = Instant::now();
        let files = &self.inner.files;
        let (digest, result) = match FileContents::read(files) {
            Ok(contents) => {
                let digest = contents.digest();
                if digest == state.loaded {
                    state.last_failure = None;
                    return ReloadOutcome::Unchanged;
                }
                if matches!(&state.last_failure, Some((Some(failed), _)) if *failed == digest) {
                    return ReloadOutcome::Failed;
                }
                (Some(digest), build_server_config(files, &contents))
            }
            Err(e) => (None, Err(e)),
        };
        match result {
            Ok(config) => {
                *self
                    .inner
                    .current
                    .write()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = config;
                state.loaded = digest.unwrap_or_default();
                state.last_failure = None;
                self.inner.reloads.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    cert = %files.cert.display(),
                    key = %files.key.display(),
                    client_ca = ?files.client_ca.as_deref().map(Path::display),
                    "TLS files changed; new connections use the reloaded certificates"
                );
                ReloadOutcome::Reloaded
            }
            Err(e) => {
                let failure = (digest, e.to_string());
                if state.last_failure.as_ref() != Some(&failure) {
                    self.inner.failed_reloads.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(
                        error = %e,
                        "TLS files changed but cannot be loaded; still serving the previous certificates"
                    );
                    state.last_failure = Some(failure);
                }
                ReloadOutcome::Failed
            }
        }
    }
}

/// Turns a listener into the stream of TLS connections tonic's `serve_with_incoming_shutdown`
/// takes. Handshakes run concurrently, each bounded by [`HANDSHAKE_TIMEOUT`]; a refused or
/// timed out handshake is counted and logged ([`Refusal`], at most once a minute per peer and
/// reason: [`RefusalLog`]) and skipped, never ending the stream. The files are
/// checked every check interval and before each handshake when a check is due.
///
/// Must be called inside a Tokio runtime: the accept loop runs on a task of its own, which
/// ends (closing the listener) when the returned stream is dropped.
pub fn incoming(
    listener: TcpListener,
    tls: ReloadingTls,
) -> impl Stream<Item = Result<TlsStream<TcpStream>, io::Error>> + Send + 'static {
    incoming_with_timeout(listener, tls, HANDSHAKE_TIMEOUT)
}

/// [`incoming`] with a chosen handshake timeout.
pub fn incoming_with_timeout(
    listener: TcpListener,
    tls: ReloadingTls,
    handshake_timeout: Duration,
) -> impl Stream<Item = Result<TlsStream<TcpStream>, io::Error>> + Send + 'static {
    // Handshakes finish in any order; the channel hands them over as they complete.
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(accept_loop(listener, tls, handshake_timeout, tx));
    ReceiverStream::new(rx)
}

async fn accept_loop(
    listener: TcpListener,
    tls: ReloadingTls,
    handshake_timeout: Duration,
    tx: mpsc::Sender<Result<TlsStream<TcpStream>, io::Error>>,
) {
    let mut handshakes: JoinSet<Option<(SocketAddr, Refusal, String)>> = JoinSet::new();
    let mut refusals = RefusalLog::default();
    let local = listener.local_addr().ok();
    let mut ticker = tokio::time::interval(tls.check_interval().max(Duration::from_millis(1)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tx.closed() => break,
            _ = ticker.tick() => tls.check_if_due(),
            Some(done) = handshakes.join_next(), if !handshakes.is_empty() => {
                if let Ok(Some((peer, refusal, error))) = done {
                    note_refusal(&mut refusals, local, peer, refusal, &error, Instant::now());
                }
            }
            accepted = listener.accept(), if handshakes.len() < MAX_PENDING_HANDSHAKES => {
                match accepted {
                    Ok((tcp, peer)) => {
                        // gRPC writes small frames; Nagle would delay them. tonic's own
                        // nodelay setting does not apply to a custom incoming stream.
                        let _ = tcp.set_nodelay(true);
                        tls.check_if_due();
                        let acceptor = TlsAcceptor::from(tls.current());
                        let tx = tx.clone();
                        handshakes.spawn(async move {
                            match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                                Ok(Ok(stream)) => {
                                    // Fails only when the server stopped; the connection is
                                    // then dropped with it.
                                    let _ = tx.send(Ok(stream)).await;
                                    None
                                }
                                Ok(Err(e)) => Some((peer, Refusal::of(&e), e.to_string())),
                                Err(_) => Some((
                                    peer,
                                    Refusal::Timeout,
                                    format!("no handshake within {handshake_timeout:?}"),
                                )),
                            }
                        });
                    }
                    Err(e) => {
                        // Usually out of file descriptors: back off instead of spinning.
                        tracing::warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }
    }
}

/// The names a client certificate identifies its holder by, for `--nodes …@CLIENT`: its DNS
/// subject alternative names, in order, or, when it has none, its subject's common name (the
/// last one, the most specific), as TLS name checks do (RFC 6125 §6.4.4). Empty when the
/// certificate cannot be parsed or names nothing. Call it only on a certificate the handshake
/// verified: the names are taken as they are written.
pub fn certificate_identities(cert: &CertificateDer<'_>) -> Vec<String> {
    let Ok(parsed) = webpki::EndEntityCert::try_from(cert) else {
        return Vec::new();
    };
    let sans: Vec<String> = parsed.valid_dns_names().map(str::to_owned).collect();
    if !sans.is_empty() {
        return sans;
    }
    crate::x509::common_name(parsed.subject())
        .into_iter()
        .collect()
}

/// The CA file a client trusts, as read and as a root store.
fn read_roots(ca: &Path) -> Result<(Vec<u8>, RootCertStore), TlsError> {
    let ca_pem = read_file("CA", ca)?;
    let mut roots = RootCertStore::empty();
    for cert in parse_certs("CA", ca, &ca_pem)? {
        roots.add(cert).map_err(|e| TlsError::BadCertificate {
            what: "CA",
            path: ca.to_owned(),
            detail: e.to_string(),
        })?;
    }
    Ok((ca_pem, roots))
}

/// Client-side TLS for tests and probes: trust `ca` for the server's certificate, expect it
/// to be valid for `domain`, and present `client_cert` (certificate, key) when given. The
/// files are validated now, with the same errors as the server side.
pub fn client_tls_config(
    ca: &Path,
    client_cert: Option<(&Path, &Path)>,
    domain: &str,
) -> Result<tonic::transport::ClientTlsConfig, TlsError> {
    // Read into roots only so that a bad CA is refused now; tonic takes the PEM.
    let (ca_pem, _) = read_roots(ca)?;
    let mut config = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca_pem))
        .domain_name(domain);
    if let Some((cert_path, key_path)) = client_cert {
        let cert_pem = read_file("client certificate", cert_path)?;
        let key_pem = read_file("client key", key_path)?;
        certified_key(
            ("client certificate", cert_path, &cert_pem),
            ("client key", key_path, &key_pem),
            &provider(),
        )?;
        config = config.identity(tonic::transport::Identity::from_pem(cert_pem, key_pem));
    }
    Ok(config)
}

/// The certificate a server presented in a handshake made with [`inspecting_client_config`],
/// kept whether or not it passed verification.
#[derive(Debug, Clone, Default)]
pub struct PresentedCertificate(Arc<Mutex<Option<CertificateDer<'static>>>>);

impl PresentedCertificate {
    /// The server's end-entity certificate, once a handshake got that far.
    pub fn get(&self) -> Option<CertificateDer<'static>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Verifies as webpki does and keeps what it was shown.
#[derive(Debug)]
struct Recording {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    seen: PresentedCertificate,
}

impl rustls::client::danger::ServerCertVerifier for Recording {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &rustls::pki_types::ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        *self.seen.0.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(end_entity.clone().into_owned());
        self.inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A rustls client configuration that checks the server exactly as [`client_tls_config`] does
/// (trusting `ca`, presenting `client_cert` when given) and records the certificate the server
/// presented, so that `probe` can show it (names, expiry), also when the handshake fails on it.
pub fn inspecting_client_config(
    ca: &Path,
    client_cert: Option<(&Path, &Path)>,
) -> Result<(Arc<rustls::ClientConfig>, PresentedCertificate), TlsError> {
    let provider = provider();
    let (_, roots) = read_roots(ca)?;
    let bad_ca = |detail: String| TlsError::BadCertificate {
        what: "CA",
        path: ca.to_owned(),
        detail,
    };
    let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .map_err(|e| bad_ca(e.to_string()))?;
    let seen = PresentedCertificate::default();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad_ca(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Recording {
            inner,
            seen: seen.clone(),
        }));
    let mut config = match client_cert {
        Some((cert_path, key_path)) => {
            let cert_pem = read_file("client certificate", cert_path)?;
            let key_pem = read_file("client key", key_path)?;
            certified_key(
                ("client certificate", cert_path, &cert_pem),
                ("client key", key_path, &key_pem),
                &provider,
            )?;
            let chain = parse_certs("client certificate", cert_path, &cert_pem)?;
            let key = parse_key("client key", key_path, &key_pem)?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| TlsError::BadPrivateKey {
                    what: "client key",
                    path: key_path.to_owned(),
                    detail: e.to_string(),
                })?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok((Arc::new(config), seen))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::string::{BmpString, Ia5String, PrintableString};
    use rcgen::{CertificateParams, DistinguishedName, DnType, DnValue, KeyPair};

    /// A self-signed certificate with these SANs (IP addresses become IP SANs) and CN.
    fn cert(sans: &[&str], cn: Option<DnValue>) -> CertificateDer<'static> {
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .expect("params");
        params.distinguished_name = DistinguishedName::new();
        if let Some(cn) = cn {
            params
                .distinguished_name
                .push(DnType::OrganizationName, "org");
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        let key = KeyPair::generate().expect("key");
        params.self_signed(&key).expect("cert").der().clone()
    }

    #[test]
    fn identities_are_the_dns_sans_else_the_common_name() {
        let utf8 = |s: &str| Some(DnValue::Utf8String(s.into()));
        let cases: [(&str, CertificateDer<'static>, &[&str]); 7] = [
            (
                "DNS SANs, in order, and the CN left out",
                cert(&["autoscaler.a", "Other.Example"], utf8("cn-a")),
                &["autoscaler.a", "Other.Example"],
            ),
            (
                "no SAN: the CN",
                cert(&[], utf8("cluster autoscaler a")),
                &["cluster autoscaler a"],
            ),
            (
                "an IP SAN is no DNS SAN: the CN",
                cert(&["10.0.0.1"], utf8("cn-b")),
                &["cn-b"],
            ),
            (
                "a PrintableString CN",
                cert(
                    &[],
                    Some(DnValue::PrintableString(
                        PrintableString::try_from("cn-p").unwrap(),
                    )),
                ),
                &["cn-p"],
            ),
            (
                "an IA5String CN",
                cert(
                    &[],
                    Some(DnValue::Ia5String(Ia5String::try_from("cn-i").unwrap())),
                ),
                &["cn-i"],
            ),
            (
                "a BMPString CN",
                cert(
                    &[],
                    Some(DnValue::BmpString(BmpString::try_from("cn-ü").unwrap())),
                ),
                &["cn-ü"],
            ),
            ("no SAN, no CN: nothing", cert(&[], None), &[]),
        ];
        for (what, der, want) in cases {
            assert_eq!(certificate_identities(&der), want, "{what}");
        }
        let garbage = CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x01]);
        assert!(certificate_identities(&garbage).is_empty());
    }
}
