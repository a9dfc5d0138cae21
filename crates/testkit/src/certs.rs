//! Throwaway certificates and the files that hold them, for the tests and benchmarks that serve
//! gRPC over TLS or mutual TLS: a CA ([`Ca`]) issuing server and client leaves ([`Leaf`]),
//! a private directory written as a secret volume is ([`TempDir`]), and the set a provider
//! process bound to one client needs ([`bound_tls`]).

use crate::process::TestTls;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// A certificate authority of its own, for one test.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate (PEM), what a peer trusts.
    pub pem: String,
}

/// A certificate and its key, PEM.
pub struct Leaf {
    pub cert: String,
    pub key: String,
}

impl Ca {
    /// A CA whose certificate's common name is `name`.
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A leaf with common name `common_name`, the DNS or IP subject alternative names `sans`,
    /// for `usage`.
    pub fn leaf(&self, common_name: &str, sans: &[&str], usage: ExtendedKeyUsagePurpose) -> Leaf {
        self.leaf_with(common_name, sans, usage, |_| {})
    }

    /// [`Ca::leaf`], its parameters changed by `adjust` before signing.
    fn leaf_with(
        &self,
        common_name: &str,
        sans: &[&str],
        usage: ExtendedKeyUsagePurpose,
        adjust: impl FnOnce(&mut CertificateParams),
    ) -> Leaf {
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(sans).expect("leaf params");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        adjust(&mut params);
        let key = KeyPair::generate().expect("leaf key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("leaf certificate");
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// The provider's server certificate: `localhost` and `127.0.0.1`.
    pub fn server(&self) -> Leaf {
        self.leaf(
            "cks-autoscaler-provider",
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// The provider's server certificate (`localhost`, `127.0.0.1`), valid until midnight UTC
    /// starting the day `year`-`month`-`day`.
    pub fn server_expiring(&self, year: i32, month: u8, day: u8) -> Leaf {
        self.leaf_with(
            "cks-autoscaler-provider",
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
            |params| params.not_after = rcgen::date_time_ymd(year, month, day),
        )
    }

    /// A client certificate with common name `common_name` and DNS names `sans`.
    pub fn client(&self, common_name: &str, sans: &[&str]) -> Leaf {
        self.leaf(common_name, sans, ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A client certificate with common name `common_name`, valid until midnight UTC starting
    /// the day `year`-`month`-`day` (a date past: an expired certificate).
    pub fn client_expiring(&self, common_name: &str, year: i32, month: u8, day: u8) -> Leaf {
        self.leaf_with(
            common_name,
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
            |params| {
                params.not_before = rcgen::date_time_ymd(year - 1, month, day);
                params.not_after = rcgen::date_time_ymd(year, month, day);
            },
        )
    }
}

/// A CA, a `localhost` server certificate and a client certificate with DNS name `client`: what
/// a provider process binding its groups to one client (`--nodes …@CLIENT`) serves with.
pub fn bound_tls(client: &str) -> TestTls {
    let ca = Ca::new("cks-provider test CA");
    let server = ca.server();
    let leaf = ca.client(client, &[client]);
    TestTls {
        ca: ca.pem,
        server_cert: server.cert,
        server_key: server.key,
        client_cert: leaf.cert,
        client_key: leaf.key,
    }
}

/// A private temporary directory, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new directory whose name starts with `cks-{name}`.
    pub fn new(name: &str) -> TempDir {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "cks-{name}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    /// The path of `file` in the directory.
    pub fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }

    /// Writes through a temporary file and a rename, as a secret volume update does, so a
    /// reader sees the old or the new file and never half of one.
    pub fn write(&self, file: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.path(file);
        let tmp = self.path(&format!(".{file}.tmp"));
        std::fs::write(&tmp, contents).expect("write temp file");
        std::fs::rename(&tmp, &path).expect("rename temp file");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
