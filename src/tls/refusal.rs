//! Refused TLS handshakes: why each was refused ([`Refusal`], read from the rustls error the
//! handshake ended with), counted by reason (`cks_provider_tls_handshakes_refused_total`), and
//! logged with the fix at most once per [`REFUSAL_LOG_WINDOW`] per peer address and reason
//! ([`RefusalLog`], whose every decision takes its time from the caller, so tests own it). The
//! provider's side of a TLS mistake, which the client's error alone does not show.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::time::Instant;

/// Why the provider refused a TLS handshake: what its log line explains and the reason label of
/// `cks_provider_tls_handshakes_refused_total`. Read from the handshake's error (the rustls
/// error tokio-rustls carries inside an I/O error), never from its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Mutual TLS and the client presented no certificate.
    NoClientCertificate,
    /// The client's certificate chains to no CA of `--tls-client-ca`.
    UnknownCa,
    /// The client's certificate names a CA of `--tls-client-ca` as its issuer, but another key
    /// signed it (a CA created again under the same name). rustls answers alert DecryptError.
    BadSignature,
    /// The client's certificate has expired.
    Expired,
    /// The client's certificate is not valid yet.
    NotYetValid,
    /// The client's certificate is refused for another reason (not for client use, revoked,
    /// unreadable).
    BadCertificate,
    /// The client refused the provider's certificate: it sent an alert.
    ClientRefusedServer,
    /// The client speaks plain text (HTTP/2 without TLS) to the TLS port.
    PlainText,
    /// No TLS version, cipher or application protocol (gRPC's `h2`) in common.
    Incompatible,
    /// The connection closed during the handshake (a TCP health check, a port scan).
    Closed,
    /// The handshake did not end within its timeout.
    Timeout,
    /// Anything else.
    Other,
}

impl Refusal {
    /// Why the handshake that ended in `error` was refused.
    pub fn of(error: &io::Error) -> Refusal {
        use rustls::CertificateError as C;
        match handshake_error(error) {
            Some(rustls::Error::NoCertificatesPresented) => Refusal::NoClientCertificate,
            Some(rustls::Error::InvalidCertificate(c)) => match c {
                C::UnknownIssuer => Refusal::UnknownCa,
                C::BadSignature => Refusal::BadSignature,
                C::Expired | C::ExpiredContext { .. } => Refusal::Expired,
                C::NotValidYet | C::NotValidYetContext { .. } => Refusal::NotYetValid,
                _ => Refusal::BadCertificate,
            },
            Some(rustls::Error::AlertReceived(_)) => Refusal::ClientRefusedServer,
            Some(rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType)) => {
                Refusal::PlainText
            }
            Some(rustls::Error::PeerIncompatible(_) | rustls::Error::NoApplicationProtocol) => {
                Refusal::Incompatible
            }
            Some(_) => Refusal::Other,
            None => match error.kind() {
                io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe => Refusal::Closed,
                io::ErrorKind::TimedOut => Refusal::Timeout,
                _ => Refusal::Other,
            },
        }
    }

    /// The reason label of `cks_provider_tls_handshakes_refused_total`.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::NoClientCertificate => "no_client_certificate",
            Refusal::UnknownCa => "unknown_ca",
            Refusal::BadSignature => "bad_signature",
            Refusal::Expired => "expired",
            Refusal::NotYetValid => "not_yet_valid",
            Refusal::BadCertificate => "bad_certificate",
            Refusal::ClientRefusedServer => "client_refused_server_certificate",
            Refusal::PlainText => "plain_text",
            Refusal::Incompatible => "incompatible",
            Refusal::Closed => "closed",
            Refusal::Timeout => "timeout",
            Refusal::Other => "other",
        }
    }

    /// What went wrong and the fix, and what the client's side shows (probe and tonic are
    /// rustls clients, the autoscaler Go's crypto/tls).
    pub fn explain(self) -> &'static str {
        match self {
            Refusal::NoClientCertificate => {
                "the client presented no certificate, and --tls-client-ca requires one: give the autoscaler's cloud-config cert and key, a client certificate issued from the CA in --tls-client-ca (the autoscaler, a Go client, also sends none when its certificate's issuer is not that CA); the client sees \"certificate required\" (rustls: CertificateRequired)"
            }
            Refusal::UnknownCa => {
                "the client's certificate is not signed by a CA in --tls-client-ca (unknown CA): issue it from that CA, or add its CA to the --tls-client-ca file; the client sees \"unknown certificate authority\" (rustls: UnknownCA)"
            }
            Refusal::BadSignature => {
                "the client's certificate names a CA of --tls-client-ca as its issuer, but another key signed it (a CA created again under the same name, the client certificate issued by the old one): issue the client certificate again from the current CA; the client sees \"error decrypting message\" (rustls: DecryptError)"
            }
            Refusal::Expired => {
                "the client's certificate has expired: renew it (cert-manager renews it; restart a client that does not read it again); the client sees \"expired certificate\" (rustls: CertificateExpired)"
            }
            Refusal::NotYetValid => {
                "the client's certificate is not valid yet: a clock is wrong (the client's node or the provider's), or it was issued for a later date"
            }
            Refusal::BadCertificate => {
                "the client's certificate is refused (the error says why): issue a client certificate (extended key usage clientAuth) from the CA in --tls-client-ca; the client sees \"unsupported certificate\" for a certificate made for servers only, else \"bad certificate\""
            }
            Refusal::ClientRefusedServer => {
                "the client refused this provider's certificate (it sent the alert in the error: BadCertificate from the autoscaler, UnknownCA from probe): its CA file (the autoscaler's cacert) is not the CA that signed --tls-cert, or the host it dials is not among the certificate's names; the client's own error says which (\"certificate signed by unknown authority\", \"certificate is valid for …, not …\")"
            }
            Refusal::PlainText => {
                "the client speaks plain text on this TLS port: give the autoscaler's cloud-config cacert (with cert and key for mutual TLS)"
            }
            Refusal::Incompatible => {
                "the client has no TLS version, cipher or protocol in common with the provider (gRPC needs ALPN h2): use a gRPC client with TLS 1.2 or 1.3"
            }
            Refusal::Closed => {
                "the connection closed during the handshake (a TCP health check, a port scan, or a client that gave up)"
            }
            Refusal::Timeout => "the client did not finish the handshake in time",
            Refusal::Other => "the handshake failed",
        }
    }

    /// Whether an operator should hear of it (a client's TLS set up wrong); closed and stalled
    /// connections are health checks and scans more often than clients, logged at debug.
    fn is_mistake(self) -> bool {
        !matches!(self, Refusal::Closed | Refusal::Timeout)
    }
}

/// The rustls error a handshake ended with: `e` itself, or what it carries inside (nested) I/O
/// errors.
fn handshake_error<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e rustls::Error> {
    if let Some(tls) = e.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    handshake_error(e.downcast_ref::<io::Error>()?.get_ref()?)
}

/// At most one log line per peer address and reason within this window (decided by
/// [`RefusalLog::admit`]); the refusals in between are counted in the next line.
pub const REFUSAL_LOG_WINDOW: Duration = Duration::from_secs(60);

/// Peer address and reason pairs [`RefusalLog`] remembers at once. When full, pairs whose
/// window has passed are dropped (with their count of refusals not logged, which the metric
/// still has); while it stays full, refusals of new pairs are counted by the metric only.
pub const REFUSAL_LOG_PAIRS: usize = 1024;

/// Which refused handshakes are logged: one line per peer address (without the port, which a
/// client changes on every try) and [`Refusal`] per [`REFUSAL_LOG_WINDOW`], so a client that
/// retries every second leaves one line a minute, with the number of refusals not logged
/// since. Time is the caller's: every decision takes the moment it is made.
#[derive(Debug, Default)]
pub struct RefusalLog {
    pairs: HashMap<(IpAddr, Refusal), LoggedPair>,
}

#[derive(Debug)]
struct LoggedPair {
    logged: Instant,
    suppressed: u64,
}

impl RefusalLog {
    /// Whether a refusal for `reason` from `peer` at `now` is logged: `Some(n)`, where `n` is
    /// the number of the same refusals not logged since the pair's previous line, or `None`
    /// (counted for the pair's next line).
    pub fn admit(&mut self, peer: IpAddr, reason: Refusal, now: Instant) -> Option<u64> {
        if let Some(pair) = self.pairs.get_mut(&(peer, reason)) {
            if now.saturating_duration_since(pair.logged) < REFUSAL_LOG_WINDOW {
                pair.suppressed += 1;
                return None;
            }
            let suppressed = pair.suppressed;
            *pair = LoggedPair {
                logged: now,
                suppressed: 0,
            };
            return Some(suppressed);
        }
        if self.pairs.len() >= REFUSAL_LOG_PAIRS {
            self.pairs
                .retain(|_, p| now.saturating_duration_since(p.logged) < REFUSAL_LOG_WINDOW);
            if self.pairs.len() >= REFUSAL_LOG_PAIRS {
                return None;
            }
        }
        self.pairs.insert(
            (peer, reason),
            LoggedPair {
                logged: now,
                suppressed: 0,
            },
        );
        Some(0)
    }
}

/// Counts a refused handshake and logs it when `log` admits it: a warning naming the peer, the
/// reason and its fix for a client's mistake, debug for a closed or stalled connection.
pub(super) fn note_refusal(
    log: &mut RefusalLog,
    listener: Option<SocketAddr>,
    peer: SocketAddr,
    refusal: Refusal,
    error: &str,
    now: Instant,
) {
    crate::metrics::record_tls_handshake_refused(refusal.label());
    let Some(suppressed) = log.admit(peer.ip(), refusal, now) else {
        return;
    };
    let listener = listener.map(|l| l.to_string()).unwrap_or_default();
    if refusal.is_mistake() {
        tracing::warn!(peer = %peer.ip(), %listener, reason = refusal.label(), error, suppressed,
            "refused a TLS handshake: {}", refusal.explain());
    } else {
        tracing::debug!(peer = %peer.ip(), %listener, reason = refusal.label(), error, suppressed,
            "refused a TLS handshake: {}", refusal.explain());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_peer_and_reason_per_window_with_the_count_not_logged() {
        let mut log = RefusalLog::default();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(log.admit(a, Refusal::UnknownCa, at(0)), Some(0));
        assert_eq!(log.admit(a, Refusal::UnknownCa, at(10)), None);
        assert_eq!(log.admit(a, Refusal::UnknownCa, at(59)), None);
        // Another reason, another peer: lines of their own.
        assert_eq!(log.admit(a, Refusal::PlainText, at(59)), Some(0));
        assert_eq!(log.admit(b, Refusal::UnknownCa, at(59)), Some(0));
        // A window after its line, the pair's next line says how many were not logged.
        assert_eq!(log.admit(a, Refusal::UnknownCa, at(60)), Some(2));
        assert_eq!(log.admit(a, Refusal::UnknownCa, at(61)), None);
        assert_eq!(log.admit(a, Refusal::UnknownCa, at(300)), Some(1));
    }

    #[test]
    fn a_full_table_logs_new_pairs_once_old_ones_expire() {
        let mut log = RefusalLog::default();
        let t0 = Instant::now();
        for i in 0..REFUSAL_LOG_PAIRS {
            let peer = IpAddr::from([10, 1, (i / 256) as u8, (i % 256) as u8]);
            assert_eq!(log.admit(peer, Refusal::Closed, t0), Some(0));
        }
        let new: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(
            log.admit(new, Refusal::UnknownCa, t0 + Duration::from_secs(1)),
            None
        );
        assert_eq!(
            log.admit(new, Refusal::UnknownCa, t0 + REFUSAL_LOG_WINDOW),
            Some(0)
        );
        assert_eq!(log.pairs.len(), 1);
    }

    #[test]
    fn the_refusal_is_read_from_the_handshakes_error() {
        use rustls::{AlertDescription, CertificateError, InvalidMessage, PeerIncompatible};
        let tls = |e: rustls::Error| io::Error::new(io::ErrorKind::InvalidData, e);
        let cases = [
            (
                tls(rustls::Error::NoCertificatesPresented),
                Refusal::NoClientCertificate,
            ),
            (
                tls(rustls::Error::InvalidCertificate(
                    CertificateError::UnknownIssuer,
                )),
                Refusal::UnknownCa,
            ),
            (
                tls(rustls::Error::InvalidCertificate(
                    CertificateError::BadSignature,
                )),
                Refusal::BadSignature,
            ),
            (
                tls(rustls::Error::InvalidCertificate(CertificateError::Expired)),
                Refusal::Expired,
            ),
            (
                tls(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidYet,
                )),
                Refusal::NotYetValid,
            ),
            (
                tls(rustls::Error::InvalidCertificate(
                    CertificateError::InvalidPurpose,
                )),
                Refusal::BadCertificate,
            ),
            (
                tls(rustls::Error::AlertReceived(AlertDescription::UnknownCA)),
                Refusal::ClientRefusedServer,
            ),
            (
                tls(rustls::Error::InvalidMessage(
                    InvalidMessage::InvalidContentType,
                )),
                Refusal::PlainText,
            ),
            (
                tls(rustls::Error::PeerIncompatible(
                    PeerIncompatible::NoCipherSuitesInCommon,
                )),
                Refusal::Incompatible,
            ),
            (
                tls(rustls::Error::NoApplicationProtocol),
                Refusal::Incompatible,
            ),
            (
                io::Error::other(tls(rustls::Error::NoCertificatesPresented)),
                Refusal::NoClientCertificate,
            ),
            (
                io::Error::from(io::ErrorKind::UnexpectedEof),
                Refusal::Closed,
            ),
            (
                io::Error::from(io::ErrorKind::ConnectionReset),
                Refusal::Closed,
            ),
            (tls(rustls::Error::DecryptError), Refusal::Other),
        ];
        for (error, want) in cases {
            assert_eq!(Refusal::of(&error), want, "{error}");
        }
    }
}
