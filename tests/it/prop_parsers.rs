//! Property tests of the parsers: the cloud-config, `--nodes` specs, durations, providerIDs,
//! CloudStack's JSON responses and job outcomes, and request signing.
//!
//! The invariants live in `fuzz/src/parsers.rs`, shared with the fuzz targets. Each property
//! runs a bounded number of cases (`PROPTEST_CASES` raises it for a longer run).

#[path = "../../fuzz/src/parsers.rs"]
mod parsers;

use cks_autoscaler_provider::config::{
    ClusterRef, MAX_NODES_LIMIT, NodeGroupSpec, parse_cloud_config, parse_cloud_config_report,
    parse_nodes_spec,
};
use cks_autoscaler_provider::grammar::parse_duration;
use cks_cloudstack::sign::{parse_query, signed_query, verify_query};
use cks_cloudstack::types::{AsyncJob, KubernetesCluster};
use parsers::{
    check_cloud_config, check_cloudstack_json, check_job_outcome, check_nodes_spec,
    check_provider_id,
};
use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{Value, json};
use std::time::Duration;

/// `cases` unless `PROPTEST_CASES` says otherwise; no regression files in the source tree.
fn config(cases: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    Config {
        cases,
        failure_persistence: None,
        // A failing case's messages carry whole clusters; bound the time spent shrinking them.
        max_shrink_time: 30_000,
        ..Config::default()
    }
}

// ---- cloud-config ----
//
// The cloud-config is read as gcfg (gopkg.in/gcfg.v1, the in-tree provider's parser) reads it.
// The generators below only write files gcfg reads to the values they expect, so every property
// is an agreement with gcfg: values end at an unquoted `;`/`#`, `"` quotes with the escapes
// `\\ \" \n \t`, a trailing `\` continues the line, repeated `[Global]` sections merge and the
// last value of a key wins, and names and section headers match in any case.

/// A secret or key as operators have them: printable ASCII with the characters ini parsers
/// like to eat (`=`, `\`, `;`, `#`, `"`, `:`, `[`, spaces inside), some non-ASCII, never
/// surrounding whitespace.
fn secret() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9_-]{20,86}",
        "[!-~]{1,40}",
        "[!-~][ -~\u{e9}\u{20ac}]{0,38}[!-~]",
        "[A-Za-z0-9+/]{20,40}={0,2}",
        "[a-z]{1,10}[\\\\;#=:\"\\[\\] ]{1,4}[a-z]{1,10}\\\\{0,2}",
    ]
}

fn is_blank(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r')
}

/// `value` in double quotes with gcfg's escapes: reads back as anything without `\r` or NUL.
fn quoted(value: &str) -> String {
    let mut out = String::from('"');
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `value` without quotes (a `"` written `\"`), when gcfg reads that back unchanged: no
/// comment characters, no backslash, no line break, no blank at the start or (when `at_end`)
/// at the end.
fn bare(value: &str, at_end: bool) -> Option<String> {
    let unusable = value.contains([';', '#', '\\', '\n', '\r'])
        || value.starts_with(is_blank)
        || (at_end && value.ends_with(is_blank));
    (!unusable).then(|| value.replace('"', "\\\""))
}

/// How a value is spelled; each spelling falls back to quoting when it cannot hold the value.
#[derive(Debug, Clone, Copy)]
enum Spelling {
    Quoted,
    Bare,
    /// Bare up to the split, quoted after it: `ab"c;d"`.
    HalfQuoted(prop::sample::Index),
    /// Bare, broken by a `\` line continuation at the split.
    Continued(prop::sample::Index),
}

fn spelling() -> impl Strategy<Value = Spelling> {
    prop_oneof![
        Just(Spelling::Quoted),
        Just(Spelling::Bare),
        any::<prop::sample::Index>().prop_map(Spelling::HalfQuoted),
        any::<prop::sample::Index>().prop_map(Spelling::Continued),
    ]
}

/// Splits `value` at a character boundary chosen by `at`, never at its ends.
fn split(value: &str, at: prop::sample::Index) -> Option<(&str, &str)> {
    let inner: Vec<usize> = value.char_indices().map(|(i, _)| i).skip(1).collect();
    if inner.is_empty() {
        return None;
    }
    Some(value.split_at(inner[at.index(inner.len())]))
}

/// `value` as `spelling` writes it, with `eol` for a continuation.
fn written(value: &str, spelling: Spelling, eol: &str) -> String {
    let spelled = match spelling {
        Spelling::Quoted => None,
        Spelling::Bare => bare(value, true),
        Spelling::HalfQuoted(at) => split(value, at)
            .and_then(|(head, tail)| Some(format!("{}{}", bare(head, false)?, quoted(tail)))),
        Spelling::Continued(at) => split(value, at).and_then(|(head, tail)| {
            // The continuation line's leading blanks belong to the value, its trailing ones
            // do not.
            let head = bare(head, false)?;
            let tail_ok = !tail.contains([';', '#', '\\', '\n', '\r']) && !tail.ends_with(is_blank);
            tail_ok.then(|| format!("{head}\\{eol}{}", tail.replace('"', "\\\"")))
        }),
    };
    spelled.unwrap_or_else(|| quoted(value))
}

/// What may follow a value: nothing, a comment after a blank, or a comment glued to it.
fn trailing_comment() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => Just(String::new()),
        1 => "[ \t]{1,3}[;#][ -~]{0,16}",
        1 => "[;#][ -~]{0,16}",
    ]
}

/// A key as operators write it: any ASCII case, blanks around.
fn key_spelling(key: &'static str) -> impl Strategy<Value = String> {
    (
        prop::collection::vec(any::<bool>(), key.len()),
        "[ \t]{0,2}",
        "[ \t]{0,2}",
    )
        .prop_map(move |(upper, before, after)| {
            let key: String = key
                .chars()
                .zip(upper)
                .map(|(c, u)| if u { c.to_ascii_uppercase() } else { c })
                .collect();
            format!("{before}{key}{after}")
        })
}

#[derive(Debug, Clone)]
struct GeneratedConfig {
    text: String,
    api_url: String,
    api_key: String,
    secret_key: String,
    ssl_no_verify: bool,
    project_id: Option<String>,
    zone: Option<String>,
}

fn url() -> impl Strategy<Value = String> {
    (
        prop::sample::select(&["http", "https"][..]),
        // Never starting with "x": a label "xn--…" is punycode, and an invalid one (such as
        // "xn---") is rightly refused as a URL, so it is no round-trip case.
        "[a-wyz][a-z0-9-]{0,10}(\\.[a-z]{2,5}){0,2}",
        prop::option::of(1..65535u16),
        prop::sample::select(&["/client/api", "", "/", "/cloud/client/api"][..]),
    )
        .prop_map(|(scheme, host, port, path)| match port {
            Some(port) => format!("{scheme}://{host}:{port}{path}"),
            None => format!("{scheme}://{host}{path}"),
        })
}

/// One `name = value` line to write, and whether a continuation may split its value (never
/// for the keys the breakage property rewrites line by line).
struct Entry {
    name: String,
    value: String,
    spelling: Spelling,
    comment: String,
}

/// A valid cloud-config with every key written in a random gcfg spelling and case, spread over
/// one to three `[Global]` sections (earlier values of the same keys overridden later), decoy
/// keys, sections and a `[Global "sub"]` subsection, comments, and `\n` or `\r\n` line ends;
/// with the values it must yield.
fn cloud_config() -> impl Strategy<Value = GeneratedConfig> {
    let bool_word = prop::sample::select(
        &[
            ("true", true),
            ("TRUE", true),
            ("yes", true),
            ("on", true),
            ("1", true),
            ("false", false),
            ("No", false),
            ("off", false),
            ("0", false),
        ][..],
    );
    (
        (url(), secret(), secret(), prop::option::of(bool_word)),
        (
            prop::option::of("[0-9a-f-]{1,36}"),
            prop::option::of("[A-Za-z0-9]([A-Za-z0-9 _-]{0,8}[A-Za-z0-9])?"),
        ),
        (
            key_spelling("api-url"),
            key_spelling("api-key"),
            key_spelling("secret-key"),
            key_spelling("ssl-no-verify"),
            key_spelling("project-id"),
            key_spelling("zone"),
        ),
        (
            prop::collection::vec(spelling(), 6),
            prop::collection::vec(trailing_comment(), 6),
            prop::collection::vec(any::<bool>(), 6),
        ),
        (
            prop::collection::vec(
                prop::sample::select(&["Global", "global", "GLOBAL", " Global ", "gLoBaL\t"][..]),
                3,
            ),
            prop::sample::select(&["\n", "\r\n"][..]),
            any::<bool>(),
            any::<bool>(),
        ),
        (
            prop::collection::vec(0..6usize, 0..6),
            prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        ),
    )
        .prop_map(
            |(
                (api_url, api_key, secret_key, ssl),
                (project_id, zone),
                keys,
                (spellings, comments, overridden),
                (headers, eol, decoys, comment_lines),
                (order_seed, section_cuts),
            )| {
                let (url_key, key_key, secret_key_name, ssl_key, project_key, zone_key) = keys;
                // Rewritten line by line by the breakage property: never continued.
                let single = |s: Spelling| match s {
                    Spelling::Continued(_) => Spelling::Quoted,
                    s => s,
                };
                let entry = |name: &str, value: &str, i: usize, spelling: Spelling| Entry {
                    name: name.to_string(),
                    value: value.to_string(),
                    spelling,
                    comment: comments[i].clone(),
                };
                let mut entries = vec![
                    entry(&url_key, &api_url, 0, single(spellings[0])),
                    entry(&key_key, &api_key, 1, single(spellings[1])),
                    entry(&secret_key_name, &secret_key, 2, spellings[2]),
                ];
                if let Some((word, _)) = ssl {
                    entries.push(entry(&ssl_key, word, 3, single(spellings[3])));
                }
                if let Some(p) = &project_id {
                    entries.push(entry(&project_key, p, 4, spellings[4]));
                }
                if let Some(z) = &zone {
                    entries.push(entry(&zone_key, z, 5, spellings[5]));
                }
                // Reorder a little: the parser does not care about key order.
                for (i, j) in order_seed.iter().enumerate() {
                    let len = entries.len();
                    entries.swap(i % len, j % len);
                }
                // Earlier values of some keys, overridden by the ones above: the last one wins.
                let earlier = [
                    ("api-url", "http://overridden.example/"),
                    ("api-key", "overridden"),
                    ("secret-key", "overridden"),
                    ("ssl-no-verify", "off"),
                    ("project-id", "overridden"),
                    ("zone", "overridden"),
                ];
                let mut lines: Vec<String> = earlier
                    .iter()
                    .zip(&overridden)
                    .zip([true, true, true, ssl.is_some(), project_id.is_some(), zone.is_some()])
                    .filter(|((_, o), present)| **o && *present)
                    .map(|(((k, v), _), _)| format!("{k} = {v}"))
                    .collect();
                lines.push("unknown-key = ignored".into());
                lines.extend(entries.iter().map(|e| {
                    format!("{} = {}{}", e.name, written(&e.value, e.spelling, eol), e.comment)
                }));

                // Cut the lines into up to three [Global] sections, with decoys between them.
                let mut cuts: Vec<usize> =
                    section_cuts.iter().map(|i| i.index(lines.len() + 1)).collect();
                cuts.sort_unstable();
                let mut text = String::new();
                if comment_lines {
                    text.push_str(&format!("; written by hand{eol}# secret-key = not-this-one{eol}"));
                }
                if decoys {
                    text.push_str(&format!("[Other]{eol}api-key = not-this-one{eol}"));
                }
                let mut start = 0;
                for (n, end) in cuts.into_iter().chain(std::iter::once(lines.len())).enumerate() {
                    text.push_str(&format!("[{}]{eol}", headers[n]));
                    for line in &lines[start..end] {
                        text.push_str(line);
                        text.push_str(eol);
                    }
                    start = end;
                    if decoys {
                        text.push_str(&format!(
                            "[Global \"sub\"]{eol}secret-key = not-this-one{eol}[Labels]{eol}zone = not-this-one{eol}"
                        ));
                    }
                }
                GeneratedConfig {
                    text,
                    api_url,
                    api_key,
                    secret_key,
                    ssl_no_verify: ssl.is_some_and(|(_, b)| b),
                    project_id,
                    zone,
                }
            },
        )
}

/// Bytes that look a bit like ini: brackets, equals signs, quotes, backslashes, line ends.
fn ini_garbage() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{0,80}",
        "[\\[\\]=:;#\"'\\\\ \t\r\na-zA-Z-]{0,80}",
        "(\\[[Gg]lobal\\]\r?\n)?([a-z-]{0,12} ?[=:] ?[ -~]{0,16}\\\\?\r?\n){0,6}",
        "(\\[[Gg]lobal( \"[a-z\\\\\"]{0,4}\")?\\]\r?\n)?([a-z-]{0,12} ?= ?[ -~\"\\\\;#]{0,16}\\\\?\r?\n){0,6}",
        any::<Vec<u8>>().prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

/// The head of a valid file; the line after it is line 4.
const HEAD: &str = "[Global]\napi-url = https://cloud.example.com/client/api\napi-key = AK\n";

proptest! {
    #![proptest_config(config(512))]

    /// Generated valid files give back exactly the values written, whatever the secret holds,
    /// however each value is spelled and however the keys are spread over [Global] sections;
    /// warnings never carry a value.
    #[test]
    fn cloud_config_round_trips_its_keys(generated in cloud_config()) {
        let report = parse_cloud_config_report(&generated.text, "cloud.conf", None, None)
            .unwrap_or_else(|e| panic!("{e}\n---\n{}", generated.text));
        let parsed = &report.config;
        prop_assert_eq!(&parsed.api_url, &generated.api_url, "{}", generated.text);
        prop_assert_eq!(&parsed.api_key, &generated.api_key, "{}", generated.text);
        prop_assert_eq!(&parsed.secret_key, &generated.secret_key, "{}", generated.text);
        prop_assert_eq!(parsed.ssl_no_verify, generated.ssl_no_verify);
        prop_assert_eq!(&parsed.project_id, &generated.project_id);
        prop_assert_eq!(&parsed.zone, &generated.zone);
        for warning in &report.warnings {
            for value in [&generated.api_key, &generated.secret_key] {
                prop_assert!(value.len() < 8 || !warning.contains(value.as_str()), "{}", warning);
            }
        }
        check_cloud_config(&generated.text, "cloud.conf");
    }

    /// Anything at all: no panic; a refusal names the source.
    #[test]
    fn cloud_config_garbage_never_panics(text in ini_garbage(), source in "[a-z/._-]{1,20}") {
        check_cloud_config(&text, &source);
    }

    /// A valid file with one key broken: refused, naming the key and the source, and the
    /// message never carries the secret.
    #[test]
    fn cloud_config_names_the_bad_key_and_keeps_the_secret(
        generated in cloud_config(),
        breakage in 0..4usize,
    ) {
        prop_assume!(generated.secret_key.len() >= 8 && !generated.secret_key.contains("overridden"));
        let replace_line = |text: &str, key: &str, new: &str| -> String {
            text.split_inclusive('\n')
                .map(|line| {
                    let name = line.split(['=', ':']).next().unwrap_or("").trim();
                    if name.eq_ignore_ascii_case(key) { new.to_string() } else { line.to_string() }
                })
                .collect()
        };
        let text = &generated.text;
        let (text, key) = match breakage {
            0 => (replace_line(text, "api-url", "api-url = ftp://x\n"), "api-url"),
            1 => (replace_line(text, "api-url", "api-url = not a url\n"), "api-url"),
            2 => {
                let bad = "ssl-no-verify = maybe\n";
                (replace_line(&replace_line(text, "unknown-key", bad), "ssl-no-verify", bad), "ssl-no-verify")
            }
            _ => (replace_line(text, "api-key", "api-key = \"\"\n"), "api-key"),
        };
        let err = parse_cloud_config(&text, "cloud.conf").expect_err(&text);
        let message = err.to_string();
        prop_assert!(message.contains("cloud.conf") && message.contains(key), "{}", message);
        prop_assert!(!message.contains(&generated.secret_key), "{}", message);
        check_cloud_config(&text, "cloud.conf");
    }

    /// gcfg ends an unquoted value at `;` or `#`: a secret written bare with one is cut there
    /// (blanks before it dropped). When the character is glued to the value, the one warning
    /// names the line and the key and holds no part of the secret.
    #[test]
    fn unquoted_comment_characters_end_the_value(
        kept in "[A-Za-z0-9+/=_-]{8,30}",
        blanks in "[ \t]{0,2}",
        ch in prop::sample::select(&[';', '#'][..]),
        rest in "[A-Za-z0-9]{6,20}",
        more in "[ -~]{0,12}",
    ) {
        let text = format!("{HEAD}secret-key = {kept}{blanks}{ch}{rest}{more}\n");
        let report = parse_cloud_config_report(&text, "cloud.conf", None, None)
            .unwrap_or_else(|e| panic!("{e}\n---\n{text}"));
        prop_assert_eq!(&report.config.secret_key, &kept);
        if blanks.is_empty() {
            prop_assert_eq!(report.warnings.len(), 1, "{:?}", report.warnings);
            let warning = &report.warnings[0];
            prop_assert!(warning.contains("line 4") && warning.contains("`secret-key`"), "{}", warning);
            prop_assert!(!warning.contains(&kept) && !warning.contains(&rest), "{}", warning);
        } else {
            prop_assert!(report.warnings.is_empty(), "{:?}", report.warnings);
        }
        // Quoted, the same characters are the secret's.
        let whole = format!("{kept}{blanks}{ch}{rest}{more}");
        let text = format!("{HEAD}secret-key = {} ; a comment\n", quoted(&whole));
        let parsed = parse_cloud_config(&text, "cloud.conf").unwrap_or_else(|e| panic!("{e}\n{text}"));
        prop_assert_eq!(parsed.secret_key, whole);
    }

    /// Inside double quotes any text survives, blanks at the ends, `\`, `"`, tabs and line
    /// breaks (as escapes), comment characters and non-ASCII included.
    #[test]
    fn quoted_values_hold_anything(value in prop_oneof![
        "\\PC{1,40}",
        "[ \t\n\\\\\";#a-z\u{e9}]{1,20}",
    ]) {
        let text = format!("{HEAD}secret-key = {}\n", quoted(&value));
        let parsed = parse_cloud_config(&text, "cloud.conf").unwrap_or_else(|e| panic!("{e}\n{text}"));
        prop_assert_eq!(parsed.secret_key, value);
    }

    /// What gcfg refuses in a secret's line (an unterminated quote, a bare backslash, an
    /// unknown escape) is an error naming that line, and never echoing the secret.
    #[test]
    fn syntax_errors_name_the_line_and_keep_the_secret(
        before in "[A-Za-z0-9]{8,20}",
        after in "[A-Za-z0-9]{8,20}",
        breakage in 0..4usize,
        blank_lines in 0..3usize,
    ) {
        let broken = match breakage {
            0 => format!("\"{before}{after}"),
            1 => format!("{before}\\{after}"),
            2 => format!("\"{before}\\q{after}\""),
            _ => format!("\"{before}\\\n{after}\""),
        };
        let text = format!("{HEAD}{}secret-key = {broken}\n", "\n".repeat(blank_lines));
        let err = parse_cloud_config(&text, "cloud.conf").expect_err(&text);
        let message = err.to_string();
        let line = format!("line {}", 4 + blank_lines);
        prop_assert!(message.contains("cloud.conf") && message.contains(&line), "{}", message);
        prop_assert!(!message.contains(&before) && !message.contains(&after), "{}", message);
    }
}

// ---- --nodes ----

fn uuid() -> impl Strategy<Value = String> {
    "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
}

proptest! {
    #![proptest_config(config(512))]

    /// `MIN:MAX:CLUSTER` with MIN ≤ MAX ≤ the limit parses to what was written: a UUID or
    /// `id=` is an id, anything else a name; spaces around parts are ignored.
    #[test]
    fn nodes_spec_round_trips(
        max in 0..=MAX_NODES_LIMIT,
        min_frac in 0.0..=1.0f64,
        cluster in prop_oneof![
            uuid().prop_map(|u| (u.clone(), ClusterRef::Id(u))),
            "[a-zA-Z0-9_.-]{1,20}".prop_map(|n| (format!("id={n}"), ClusterRef::Id(n))),
            "[a-zA-Z0-9_.=-]([a-zA-Z0-9 _.=-]{0,20}[a-zA-Z0-9_.-])?"
                .prop_map(|n| (format!("name={n}"), ClusterRef::Name(n))),
            "[a-hj-mo-z][a-zA-Z0-9_.-]{0,20}".prop_map(|n| (n.clone(), ClusterRef::Name(n))),
        ],
        pad in prop::collection::vec("[ \t]{0,2}", 6),
    ) {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let min = (f64::from(max) * min_frac).floor() as u32;
        let (written, expected) = cluster;
        let text = format!("{}{min}{}:{}{max}{}:{}{written}{}", pad[0], pad[1], pad[2], pad[3], pad[4], pad[5]);
        let spec = parse_nodes_spec(&text).unwrap_or_else(|e| panic!("{e}"));
        prop_assert_eq!(spec, NodeGroupSpec { min, max, cluster: expected });
        check_nodes_spec(&text);
    }

    /// MIN greater than MAX, or MAX over the limit, is refused with both numbers named.
    #[test]
    fn nodes_spec_refuses_min_over_max_and_max_over_limit(
        a in 0..=MAX_NODES_LIMIT + 10,
        b in 0..=MAX_NODES_LIMIT + 10,
        cluster in uuid(),
    ) {
        let text = format!("{a}:{b}:{cluster}");
        let result = parse_nodes_spec(&text);
        if a > b || b > MAX_NODES_LIMIT {
            let message = result.expect_err(&text).to_string();
            prop_assert!(message.contains(&format!("{text:?}")), "{}", message);
            if a > b {
                prop_assert!(message.contains(&format!("MIN {a} is greater than MAX {b}")), "{}", message);
            } else {
                prop_assert!(message.contains(&format!("MAX {b} exceeds")), "{}", message);
            }
        } else {
            prop_assert_eq!(result.expect(&text).max, b);
        }
    }

    /// Anything at all: no panic; a refusal quotes the input; an acceptance keeps MIN ≤ MAX.
    #[test]
    fn nodes_spec_garbage_never_panics(s in prop_oneof![
        "\\PC{0,40}",
        "[0-9: =a-z-]{0,30}",
        "-?[0-9]{1,12}:-?[0-9]{1,12}:(id=|name=)?\\PC{0,12}",
    ]) {
        check_nodes_spec(&s);
    }
}

// ---- providerID ----

proptest! {
    #![proptest_config(config(512))]

    /// The default providerID of a VM id names that id; any string parses to the part after
    /// its first `://`, never to an empty id.
    #[test]
    fn provider_ids_round_trip(id in prop_oneof![
        "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        "[^:/]{1,20}",
        "\\PC{0,20}",
        "(\\PC{0,5}://){1,3}\\PC{0,5}",
    ]) {
        check_provider_id(&id);
        if !id.is_empty() && !id.contains("://") {
            let provider_id = cks_domain::nodeid::default_provider_id(&id);
            prop_assert_eq!(
                cks_domain::nodeid::vm_id_from_provider_id(&provider_id),
                Some(id.as_str())
            );
            prop_assert_eq!(
                cks_domain::nodeid::vm_id_from_provider_id(&id),
                Some(id.as_str())
            );
        }
    }
}

// ---- durations ----
//
// One grammar for every duration a user writes (flags, the config file, the probe,
// `--node-group-options`): `<number><unit>` parts with ms, s, m, h, or a bare number of seconds.

proptest! {
    #![proptest_config(config(512))]

    /// Parts written in any order, with whole or decimal numbers, add up exactly.
    #[test]
    fn durations_written_in_parts_add_up(
        parts in prop::collection::vec((0u64..50_000, 0u32..1000, 0usize..4), 1..5),
    ) {
        const UNITS: [(&str, u64); 4] = [("ms", 1_000_000), ("s", 1_000_000_000), ("m", 60_000_000_000), ("h", 3_600_000_000_000)];
        let mut text = String::new();
        let mut nanos: u128 = 0;
        for (whole, thousandths, unit) in &parts {
            let (name, unit_nanos) = UNITS[*unit];
            text.push_str(&format!("{whole}.{thousandths:03}{name}"));
            nanos += u128::from(*whole) * u128::from(unit_nanos)
                + u128::from(*thousandths) * u128::from(unit_nanos) / 1000;
        }
        let d = parse_duration(&text).map_err(TestCaseError::fail)?;
        prop_assert_eq!(d.as_nanos(), nanos, "{}", text);
    }

    /// A bare number is seconds.
    #[test]
    fn a_bare_number_is_seconds(secs in 0u64..1_000_000_000) {
        prop_assert_eq!(parse_duration(&secs.to_string()), Ok(Duration::from_secs(secs)));
    }

    /// Any text is parsed without panicking; a refusal quotes it and names the units.
    #[test]
    fn any_duration_text_is_refused_by_name_or_accepted(text in prop_oneof![
        "\\PC{0,12}",
        "[0-9.]{0,6}[a-z]{0,3}[0-9.]{0,4}[a-z ]{0,3}",
    ]) {
        if let Err(e) = parse_duration(&text) {
            let trimmed = text.trim();
            prop_assert!(trimmed.is_empty() || e.contains(&format!("{trimmed:?}")), "{}", e);
            prop_assert!(e.contains("ms, s, m or h"), "{}", e);
        }
    }
}

// ---- CloudStack JSON ----

/// A JSON number CloudStack may send as a number, a string, a padded string or a whole float.
fn lenient_number(n: u64) -> impl Strategy<Value = Value> {
    let mut forms = vec![json!(n), json!(n.to_string()), json!(format!(" {n} "))];
    if n < (1 << 52) {
        #[allow(clippy::cast_precision_loss)]
        forms.push(json!(n as f64));
    }
    prop::sample::select(forms)
}

fn lenient_bool(b: bool) -> impl Strategy<Value = Value> {
    let mut forms = vec![
        json!(b),
        json!(b.to_string()),
        json!(b.to_string().to_uppercase()),
    ];
    if !b {
        forms.extend([json!(""), Value::Null]);
    }
    prop::sample::select(forms)
}

/// An optional field: absent, null, `""` (for numbers), or present.
fn optional_number(n: Option<u64>) -> BoxedStrategy<Option<Value>> {
    match n {
        Some(n) => lenient_number(n).prop_map(Some).boxed(),
        None => prop::sample::select(vec![None, Some(Value::Null), Some(json!(""))]).boxed(),
    }
}

fn cluster_json() -> impl Strategy<Value = (Value, KubernetesCluster)> {
    let vm = (
        "[0-9a-f-]{1,36}",
        "\\PC{0,20}",
        "[A-Za-z]{0,10}",
        any::<bool>(),
        any::<bool>(),
    )
        .prop_flat_map(|(id, name, state, ext, etcd)| {
            (
                Just((id, name, state, ext, etcd)),
                lenient_bool(ext),
                lenient_bool(etcd),
            )
        });
    (
        ("[0-9a-f-]{1,36}", "\\PC{0,20}", "[A-Za-z]{1,12}"),
        (
            0..50u64,
            0..5u64,
            prop::option::of(0..5u64),
            prop::option::of(0..10u64),
            prop::option::of(0..100u64),
        ),
        any::<bool>(),
        prop::collection::vec(vm, 0..5),
    )
        .prop_flat_map(
            |(strings, (size, controls, etcd, min, max), autoscaling, vms)| {
                (
                    Just((strings, vms.clone())),
                    (lenient_number(size), lenient_number(controls)),
                    (
                        optional_number(etcd),
                        optional_number(min),
                        optional_number(max),
                    ),
                    lenient_bool(autoscaling),
                    Just((size, controls, etcd, min, max, autoscaling)),
                )
            },
        )
        .prop_map(
            |((strings, vms), (size_v, controls_v), (etcd_v, min_v, max_v), auto_v, plain)| {
                let (id, name, state) = strings;
                let (size, controls, etcd, min, max, autoscaling) = plain;
                let mut obj = json!({
                    "id": id, "name": name, "state": state,
                    "size": size_v, "controlnodes": controls_v, "autoscalingenabled": auto_v,
                    "serviceofferingid": "so-1", "zonename": "zone1",
                    "unknownfield": {"nested": [1, 2, 3]},
                });
                for (key, v) in [
                    ("etcdnodes", etcd_v),
                    ("minsize", min_v),
                    ("maxsize", max_v),
                ] {
                    if let Some(v) = v {
                        obj[key] = v;
                    }
                }
                obj["virtualmachines"] = Value::Array(
                    vms.iter()
                        .map(|((id, name, state, _, _), ext_v, etcd_v)| {
                            json!({"id": id, "name": name, "state": state,
                               "isexternalnode": ext_v, "isetcdnode": etcd_v})
                        })
                        .collect(),
                );
                let expected = KubernetesCluster {
                    id,
                    name,
                    state,
                    size,
                    controlnodes: controls,
                    etcdnodes: etcd,
                    minsize: min,
                    maxsize: max,
                    autoscalingenabled: autoscaling,
                    serviceofferingid: Some("so-1".into()),
                    zonename: Some("zone1".into()),
                    virtualmachines: vms
                        .iter()
                        .map(|((id, name, state, ext, etcd), _, _)| {
                            cks_cloudstack::types::ClusterVm {
                                id: id.clone(),
                                name: name.clone(),
                                state: state.clone(),
                                isexternalnode: *ext,
                                isetcdnode: *etcd,
                                ..Default::default()
                            }
                        })
                        .collect(),
                    ..Default::default()
                };
                (obj, expected)
            },
        )
}

fn job_json() -> impl Strategy<Value = Value> {
    let status = prop_oneof![
        4 => (0..=3i64).prop_map(|s| json!(s)),
        1 => (0..=3i64).prop_map(|s| json!(s.to_string())),
        1 => any::<i64>().prop_map(|s| json!(s)),
    ];
    let code = prop_oneof![
        Just(json!(530)),
        Just(json!("533")),
        Just(json!(" 535 ")),
        any::<i64>().prop_map(|c| json!(c)),
        Just(json!("x")),
    ]
    .boxed();
    let result = prop_oneof![
        Just(None),
        Just(Some(Value::Null)),
        "\\PC{0,20}".prop_map(|s| Some(json!(s))),
        (
            prop::option::of(code.clone()),
            prop::option::of("\\PC{0,20}")
        )
            .prop_map(|(c, t)| {
                let mut r = json!({});
                if let Some(c) = c {
                    r["errorcode"] = c;
                }
                if let Some(t) = t {
                    r["errortext"] = json!(t);
                }
                Some(r)
            }),
        cluster_json().prop_map(|(c, _)| Some(json!({"kubernetescluster": c}))),
        Just(Some(json!({"kubernetescluster": {"id": 5}}))),
    ];
    let result_code = prop_oneof![
        Just(json!(530)),
        Just(json!("530")),
        Just(json!(0)),
        any::<i64>().prop_map(|c| json!(c)),
    ];
    ("[0-9a-f-]{1,36}", status, prop::option::of(result_code), result).prop_map(|(jobid, status, code, result)| {
        let mut job = json!({"jobid": jobid, "jobstatus": status,
                             "cmd": "org.apache.cloudstack.api.command.user.kubernetes.cluster.ScaleKubernetesClusterCmd"});
        if let Some(c) = code { job["jobresultcode"] = c; }
        if let Some(r) = result { job["jobresult"] = r; }
        job
    })
}

/// Any byte string, and valid JSON cut short or with a byte flipped.
fn json_bytes() -> impl Strategy<Value = Vec<u8>> {
    let valid = prop_oneof![
        cluster_json().prop_map(|(c, _)| json!({"listkubernetesclustersresponse": {"count": 1, "kubernetescluster": [c]}})),
        job_json().prop_map(|j| json!({"queryasyncjobresultresponse": j})),
        job_json(),
        cluster_json().prop_map(|(c, _)| c),
    ]
    .prop_map(|v| v.to_string().into_bytes())
    .boxed();
    prop_oneof![
        any::<Vec<u8>>(),
        "[\\[\\]{}\":,0-9a-z. -]{0,60}".prop_map(String::into_bytes),
        (valid.clone(), any::<prop::sample::Index>())
            .prop_map(|(b, i)| b[..i.index(b.len())].to_vec()),
        (valid.clone(), any::<prop::sample::Index>(), any::<u8>()).prop_map(|(mut b, i, x)| {
            let i = i.index(b.len());
            b[i] = x;
            b
        }),
        valid,
    ]
}

proptest! {
    #![proptest_config(config(512))]

    /// A cluster parses to the same value whichever form CloudStack uses for its numbers and
    /// booleans (native, string, padded string, whole float; null/"" for absent options).
    #[test]
    fn clusters_parse_numbers_sent_as_strings((value, expected) in cluster_json()) {
        let text = value.to_string();
        let parsed: KubernetesCluster = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        prop_assert_eq!(&parsed, &expected);
        let via_value: KubernetesCluster = serde::Deserialize::deserialize(&value).unwrap();
        prop_assert_eq!(&via_value, &expected);
    }

    /// Counts that are not whole non-negative numbers are refused, not wrapped or truncated.
    #[test]
    fn clusters_refuse_counts_that_are_not_counts(bad in prop_oneof![
        (i64::MIN..0).prop_map(|n| json!(n)),
        (i64::MIN..0).prop_map(|n| json!(n.to_string())),
        Just(json!(4.5)),
        Just(json!("4.5")),
        Just(json!("four")),
        Just(json!(1.0e300)),
        Just(json!("99999999999999999999999")),
        Just(json!(true)),
        Just(json!([1])),
    ]) {
        let text = json!({"id": "c", "name": "k8s", "state": "Running", "size": bad}).to_string();
        prop_assert!(serde_json::from_str::<KubernetesCluster>(&text).is_err(), "{}", text);
    }

    /// Job outcomes follow jobstatus; failures carry CloudStack's code and text.
    #[test]
    fn job_outcomes_follow_the_status(value in job_json()) {
        let text = value.to_string();
        let job: AsyncJob = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        check_job_outcome(&job);
    }

    /// Arbitrary, truncated and corrupted JSON: no panic in any response type or job outcome.
    #[test]
    fn cloudstack_json_garbage_never_panics(bytes in json_bytes()) {
        check_cloudstack_json(&bytes);
    }
}

// ---- request signing (what the simulator checks on every request) ----

fn param() -> impl Strategy<Value = (String, String)> {
    (
        prop_oneof!["[a-zA-Z]{1,12}", "\\PC{0,8}"],
        prop_oneof!["[ -~]{0,20}", "\\PC{0,12}"],
    )
        .prop_filter("reserved names", |(n, _)| n != "apiKey" && n != "signature")
}

proptest! {
    #![proptest_config(config(256))]

    /// A signed query verifies with its secret, and not with another secret or with a value
    /// changed; parsing any query string never panics.
    #[test]
    fn signed_queries_verify(
        params in prop::collection::vec(param(), 0..6),
        api_key in "[!-~]{1,30}",
        secret in "[!-~]{1,30}",
        other in "[!-~]{1,30}",
        garbage in "\\PC{0,60}",
    ) {
        let query = signed_query(&params, &api_key, &secret);
        prop_assert!(verify_query(&query, &secret), "{}", query);
        if other != secret {
            prop_assert!(!verify_query(&query, &other), "{}", query);
        }
        let parsed = parse_query(&query);
        for (name, value) in &params {
            prop_assert!(parsed.contains(&(name.clone(), value.clone())), "{:?} in {}", name, query);
        }
        let tampered = query.replacen("apiKey=", "apiKey=x", 1);
        prop_assert!(!verify_query(&tampered, &secret), "{}", tampered);
        let _ = parse_query(&garbage);
        let _ = verify_query(&garbage, &secret);
    }
}
