//! Certificates for a provider process serving several clusters, which must bind each group to
//! its client over mutual TLS (`--nodes MIN:MAX:CLUSTER@CLIENT`): one throwaway CA, a server
//! certificate for `localhost` and a client certificate naming `client`. Shared by the
//! benchmarks and the soak test (`#[path]`), the only users of rcgen outside test files.

use cks_autoscaler_provider::testkit::process::TestTls;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A CA, a `localhost` server certificate and a client certificate with DNS SAN `client`.
pub fn bound_tls(client: &str) -> TestTls {
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.distinguished_name
        .push(DnType::CommonName, "cks-provider test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().expect("CA key");
    let ca_pem = ca.self_signed(&ca_key).expect("CA certificate").pem();
    let issuer = Issuer::new(ca, ca_key);
    let leaf = |name: &str, sans: Vec<String>, usage: ExtendedKeyUsagePurpose| {
        let mut params = CertificateParams::new(sans).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &issuer).expect("leaf certificate");
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf(
        "cks-autoscaler-provider",
        vec!["localhost".into(), "127.0.0.1".into()],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (client_cert, client_key) = leaf(
        client,
        vec![client.into()],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    TestTls {
        ca: ca_pem,
        server_cert,
        server_key,
        client_cert,
        client_key,
    }
}
