//! What an X.509 certificate says that webpki does not hand out: the last common name of a
//! `Name` (a client identity without SANs), the validity period and the subject alternative
//! names (what `probe` shows of the certificate a server presented).
//!
//! A small DER walk over certificates that arrive whole from a TLS handshake or a PEM file: it
//! reads, it never verifies (rustls and webpki do), and anything it does not understand gives
//! `None` rather than a guess.

use std::net::IpAddr;
use time::{Date, Month, OffsetDateTime, PrimitiveDateTime, Time};

/// What a certificate names and how long it is valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateSummary {
    /// The subject's last common name, if any.
    pub common_name: Option<String>,
    /// DNS names among the subject alternative names, in order.
    pub dns_names: Vec<String>,
    /// IP addresses among the subject alternative names, in order.
    pub ip_addresses: Vec<IpAddr>,
    /// Start of validity (`notBefore`).
    pub not_before: OffsetDateTime,
    /// End of validity (`notAfter`).
    pub not_after: OffsetDateTime,
}

impl CertificateSummary {
    /// The names a client can verify the certificate for: DNS names, then IP addresses.
    pub fn names(&self) -> Vec<String> {
        self.dns_names
            .iter()
            .cloned()
            .chain(self.ip_addresses.iter().map(IpAddr::to_string))
            .collect()
    }
}

/// OID 2.5.29.17 (id-ce-subjectAltName), DER-encoded.
const OID_SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];

/// Reads a DER certificate. `None` when it is not a certificate this walk understands.
pub fn summarize(der: &[u8]) -> Option<CertificateSummary> {
    let (certificate, _) = der_item(der, 0x30)?;
    let (tbs, _) = der_item(certificate, 0x30)?;
    let mut rest = tbs;
    // version [0] EXPLICIT, absent for v1.
    if rest.first() == Some(&0xa0) {
        rest = der_item(rest, 0xa0)?.1;
    }
    let (_serial, rest) = der_item(rest, 0x02)?;
    let (_signature, rest) = der_item(rest, 0x30)?;
    let (_issuer, rest) = der_item(rest, 0x30)?;
    let (validity, rest) = der_item(rest, 0x30)?;
    let (not_before, after) = der_time(validity)?;
    let (not_after, _) = der_time(after)?;
    let (subject, rest) = der_item(rest, 0x30)?;
    let (_key, mut rest) = der_item(rest, 0x30)?;
    let mut summary = CertificateSummary {
        common_name: common_name(subject),
        dns_names: Vec::new(),
        ip_addresses: Vec::new(),
        not_before,
        not_after,
    };
    while let Some((&tag, _)) = rest.split_first() {
        let (contents, next) = der_item(rest, tag)?;
        rest = next;
        // issuerUniqueID [1] and subjectUniqueID [2] are skipped; extensions are [3].
        if tag != 0xa3 {
            continue;
        }
        let (mut extensions, _) = der_item(contents, 0x30)?;
        while !extensions.is_empty() {
            let (extension, next) = der_item(extensions, 0x30)?;
            extensions = next;
            let (oid, mut value) = der_item(extension, 0x06)?;
            if oid != OID_SUBJECT_ALT_NAME {
                continue;
            }
            if value.first() == Some(&0x01) {
                value = der_item(value, 0x01)?.1; // critical
            }
            let (octets, _) = der_item(value, 0x04)?;
            let (mut names, _) = der_item(octets, 0x30)?;
            while let Some((&tag, _)) = names.split_first() {
                let (name, next) = der_item(names, tag)?;
                names = next;
                match tag {
                    // dNSName [2] IA5String
                    0x82 => summary
                        .dns_names
                        .push(String::from_utf8(name.to_vec()).ok()?),
                    // iPAddress [7] OCTET STRING
                    0x87 => summary.ip_addresses.push(match name.len() {
                        4 => IpAddr::from(<[u8; 4]>::try_from(name).ok()?),
                        16 => IpAddr::from(<[u8; 16]>::try_from(name).ok()?),
                        _ => return None,
                    }),
                    _ => {}
                }
            }
        }
    }
    Some(summary)
}

/// One `Time` (UTCTime or GeneralizedTime, in the `Z` forms RFC 5280 §4.1.2.5 allows) and what
/// follows it.
fn der_time(input: &[u8]) -> Option<(OffsetDateTime, &[u8])> {
    let (&tag, _) = input.split_first()?;
    let (text, rest) = der_item(input, tag)?;
    let text = std::str::from_utf8(text).ok()?;
    let digits = text.strip_suffix('Z')?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let number = |range: std::ops::Range<usize>| digits.get(range)?.parse::<u16>().ok();
    let (year, at) = match (tag, digits.len()) {
        // UTCTime: YY below 50 is 20YY (RFC 5280 §4.1.2.5.1).
        (0x17, 12) => {
            let yy = number(0..2)?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, 2)
        }
        (0x18, 14) => (number(0..4)?, 4),
        _ => return None,
    };
    let part = |i: usize| -> Option<u8> { u8::try_from(number(at + 2 * i..at + 2 * i + 2)?).ok() };
    let date = Date::from_calendar_date(i32::from(year), Month::try_from(part(0)?).ok()?, part(1)?)
        .ok()?;
    let time = Time::from_hms(part(2)?, part(3)?, part(4)?).ok()?;
    Some((PrimitiveDateTime::new(date, time).assume_utc(), rest))
}

/// A UTC time as an operator reads it: `2031-05-17 12:00:00 UTC`.
pub fn format_utc(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// OID 2.5.4.3 (id-at-commonName), DER-encoded.
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

/// The last common name in a DER `Name` (the contents of its SEQUENCE, as webpki hands them
/// over): a sequence of SETs of `SEQUENCE { type OID, value }`. `None` when there is none or
/// the encoding is not what DER allows.
pub(crate) fn common_name(name: &[u8]) -> Option<String> {
    let mut found = None;
    let mut rdns = name;
    while !rdns.is_empty() {
        let (set, rest) = der_item(rdns, 0x31)?;
        rdns = rest;
        let mut attributes = set;
        while !attributes.is_empty() {
            let (attribute, rest) = der_item(attributes, 0x30)?;
            attributes = rest;
            let (oid, value) = der_item(attribute, 0x06)?;
            if oid == OID_COMMON_NAME {
                found = Some(directory_string(value)?);
            }
        }
    }
    found
}

/// The text of a DER DirectoryString (UTF8String, PrintableString, IA5String, TeletexString
/// holding UTF-8, or BMPString).
fn directory_string(item: &[u8]) -> Option<String> {
    let (&tag, _) = item.split_first()?;
    let (text, rest) = der_item(item, tag)?;
    if !rest.is_empty() {
        return None;
    }
    match tag {
        0x0c | 0x13 | 0x16 | 0x14 => String::from_utf8(text.to_vec()).ok(),
        0x1e if text.len() % 2 == 0 => String::from_utf16(
            &text
                .chunks_exact(2)
                .map(|p| u16::from_be_bytes([p[0], p[1]]))
                .collect::<Vec<_>>(),
        )
        .ok(),
        _ => None,
    }
}

/// Splits one DER item with tag `tag` off `input`: its contents and what follows. Definite
/// lengths only (DER has no other), up to four length bytes.
fn der_item(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&found, input) = input.split_first()?;
    if found != tag {
        return None;
    }
    let (&first, mut input) = input.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || input.len() < count {
            return None;
        }
        let (bytes, rest) = input.split_at(count);
        input = rest;
        bytes.iter().fold(0usize, |n, b| (n << 8) | usize::from(*b))
    };
    (input.len() >= len).then(|| input.split_at(len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, KeyPair};

    fn at(y: i32, m: u8, d: u8, h: u8, mi: u8, s: u8) -> OffsetDateTime {
        let date =
            Date::from_calendar_date(y, Month::try_from(m).expect("month"), d).expect("date");
        PrimitiveDateTime::new(date, Time::from_hms(h, mi, s).expect("time")).assume_utc()
    }

    #[test]
    fn the_summary_has_the_names_and_both_ends_of_validity() {
        let mut params = CertificateParams::new(vec![
            "localhost".to_string(),
            "cks-autoscaler-provider.kube-system.svc".to_string(),
            "127.0.0.1".to_string(),
            "::1".to_string(),
        ])
        .expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "the provider");
        // One date on each side of 2050: UTCTime before, GeneralizedTime after (RFC 5280).
        params.not_before = at(2026, 3, 4, 5, 6, 7);
        params.not_after = at(2051, 12, 31, 23, 59, 58);
        let key = KeyPair::generate().expect("key");
        let der = params.self_signed(&key).expect("cert").der().to_vec();
        let s = summarize(&der).expect("a summary");
        assert_eq!(s.common_name.as_deref(), Some("the provider"));
        assert_eq!(
            s.dns_names,
            ["localhost", "cks-autoscaler-provider.kube-system.svc"]
        );
        assert_eq!(
            s.names(),
            [
                "localhost",
                "cks-autoscaler-provider.kube-system.svc",
                "127.0.0.1",
                "::1"
            ]
        );
        assert_eq!(format_utc(s.not_before), "2026-03-04 05:06:07 UTC");
        assert_eq!(format_utc(s.not_after), "2051-12-31 23:59:58 UTC");
        // Cut short anywhere: no summary rather than a misread one.
        for cut in 0..der.len() {
            assert_eq!(summarize(&der[..cut]), None, "cut at {cut}");
        }
    }

    #[test]
    fn times_read_as_rfc_5280_writes_them() {
        let encoded = |tag: u8, text: &str| {
            let der = [&[tag, text.len() as u8][..], text.as_bytes()].concat();
            der_time(&der).map(|(t, _)| t)
        };
        let utc = |text: &str| encoded(0x17, text);
        let generalized = |text: &str| encoded(0x18, text);
        let read = |t: Option<OffsetDateTime>| t.map(format_utc);
        assert_eq!(
            read(utc("491231235959Z")).as_deref(),
            Some("2049-12-31 23:59:59 UTC")
        );
        assert_eq!(
            read(utc("500101000000Z")).as_deref(),
            Some("1950-01-01 00:00:00 UTC")
        );
        assert_eq!(
            read(generalized("20500101000000Z")).as_deref(),
            Some("2050-01-01 00:00:00 UTC")
        );
        for bad in [
            "491231235959",
            "4912312359Z",
            "491331235959Z",
            "49123123595aZ",
        ] {
            assert_eq!(read(utc(bad)), None, "{bad}");
        }
        assert_eq!(read(generalized("491231235959Z")), None);
    }

    #[test]
    fn the_common_name_reader_takes_the_last_and_refuses_bad_lengths() {
        // SET { SEQUENCE { OID, UTF8String } } for each value.
        let rdn = |oid: &[u8], text: &str| {
            let mut atv = vec![0x06, oid.len() as u8];
            atv.extend_from_slice(oid);
            atv.extend([0x0c, text.len() as u8]);
            atv.extend_from_slice(text.as_bytes());
            let mut seq = vec![0x30, atv.len() as u8];
            seq.extend(atv);
            let mut set = vec![0x31, seq.len() as u8];
            set.extend(seq);
            set
        };
        let org = [0x55, 0x04, 0x0a];
        let mut name = rdn(OID_COMMON_NAME, "first");
        name.extend(rdn(&org, "org"));
        name.extend(rdn(OID_COMMON_NAME, "last"));
        assert_eq!(common_name(&name).as_deref(), Some("last"));
        assert_eq!(common_name(&rdn(&org, "org")), None);
        assert_eq!(common_name(&[]), None);
        // Cut short anywhere: no name rather than a misread one.
        for cut in 1..name.len() {
            let got = common_name(&name[..cut]);
            assert!(
                got.is_none() || got.as_deref() == Some("first"),
                "{cut}: {got:?}"
            );
        }
        // Long-form lengths read; a length past the end is refused.
        let long = [0x04, 0x81, 0x02, 0xaa, 0xbb, 0xcc];
        assert_eq!(
            der_item(&long, 0x04),
            Some((&[0xaa, 0xbb][..], &[0xcc][..]))
        );
        assert_eq!(der_item(&[0x04, 0x82, 0x01, 0x00, 0xaa], 0x04), None);
        assert_eq!(der_item(&[0x04, 0x80], 0x04), None);
        assert_eq!(der_item(&[0x05, 0x00], 0x04), None);
    }
}
