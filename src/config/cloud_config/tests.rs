use super::*;

const URL: &str = "https://cloud.example.com/client/api";
const HEAD: &str = "[Global]\napi-url = https://cloud.example.com/client/api\napi-key = AK\n";

fn ok(text: &str) -> CloudConfig {
    parse_cloud_config(text, "cloud-config").unwrap_or_else(|e| panic!("{e}\n---\n{text}"))
}

fn report(text: &str) -> CloudConfigReport {
    parse_cloud_config_report(text, "cloud-config", None, None)
        .unwrap_or_else(|e| panic!("{e}\n---\n{text}"))
}

/// The secret-key that `line`, written as line 4 after a valid head, yields.
fn secret_of(line: &str) -> Result<String, String> {
    parse_cloud_config(&format!("{HEAD}{line}\n"), "c")
        .map(|c| c.secret_key)
        .map_err(|e| e.to_string())
}

#[test]
fn cloud_config_accepts_what_operators_have() {
    struct Case {
        name: &'static str,
        text: &'static str,
        key: &'static str,
        secret: &'static str,
        ssl_no_verify: bool,
        project: Option<&'static str>,
        zone: Option<&'static str>,
    }
    let cases = [
        Case {
            name: "minimal, as CKS's deploy-cloudstack-secret writes it",
            text: "[Global]\napi-url = https://cloud.example.com/client/api\napi-key = AK\nsecret-key = SK\n",
            key: "AK",
            secret: "SK",
            ssl_no_verify: false,
            project: None,
            zone: None,
        },
        Case {
            name: "all keys, CRLF, comments, unknown keys and sections",
            text: "; written by deploy-cloudstack-secret\r\n# another comment\r\n[Global]\r\n\
                   api-url=https://cloud.example.com/client/api\r\napi-key=AK\r\nsecret-key=SK\r\n\
                   ssl-no-verify=true\r\nproject-id=p-1\r\nzone=zone1\r\nregion=r1\r\n\
                   [LoadBalancer]\r\nfoo=bar\r\n",
            key: "AK",
            secret: "SK",
            ssl_no_verify: true,
            project: Some("p-1"),
            zone: Some("zone1"),
        },
        Case {
            name: "secrets with = stay verbatim, backslashes inside quotes",
            text: "[Global]\napi-url = https://cloud.example.com/client/api\n\
                   api-key = ab=cd==\nsecret-key = \"s\\\\e\\\\\\\\cr=et\\\\n\"\n",
            key: "ab=cd==",
            secret: "s\\e\\\\cr=et\\n",
            ssl_no_verify: false,
            project: None,
            zone: None,
        },
        Case {
            name: "comment characters inside quotes, a comment after them",
            text: "[Global]\napi-url = https://cloud.example.com/client/api\n\
                   api-key = \"a;b#c\" ; the key\nsecret-key = \"abc\\\\\" # ends in a backslash\nzone = z\n",
            key: "a;b#c",
            secret: "abc\\",
            ssl_no_verify: false,
            project: None,
            zone: Some("z"),
        },
        Case {
            name: "quoted values and case-insensitive names (gcfg compatible)",
            text: "[global]\nAPI-URL = \"https://cloud.example.com/client/api\"\nApi-Key = \"AK\"\n\
                   secret-key = \"S K\"\nssl-no-verify = FALSE\nproject-id =\n",
            key: "AK",
            secret: "S K",
            ssl_no_verify: false,
            project: None,
            zone: None,
        },
        Case {
            name: "repeated [Global] sections merge; the last value wins",
            text: "[Global]\napi-url = https://cloud.example.com/client/api\nsecret-key = old\n\
                   [Other]\nsecret-key = not-this\n[GLOBAL]\napi-key = AK\nsecret-key = SK\n\
                   [ Global ]\nzone = z\n",
            key: "AK",
            secret: "SK",
            ssl_no_verify: false,
            project: None,
            zone: Some("z"),
        },
        Case {
            name: "byte-order mark, bare boolean, indented lines",
            text: "\u{feff}[Global]\n  api-url = https://cloud.example.com/client/api\n\tapi-key = AK\n\
                   secret-key = SK\nssl-no-verify\n",
            key: "AK",
            secret: "SK",
            ssl_no_verify: true,
            project: None,
            zone: None,
        },
    ];
    for case in cases {
        let cfg = ok(case.text);
        assert_eq!(cfg.api_url, URL, "{}", case.name);
        assert_eq!(cfg.api_key, case.key, "{}", case.name);
        assert_eq!(cfg.secret_key, case.secret, "{}", case.name);
        assert_eq!(cfg.ssl_no_verify, case.ssl_no_verify, "{}", case.name);
        assert_eq!(cfg.project_id.as_deref(), case.project, "{}", case.name);
        assert_eq!(cfg.zone.as_deref(), case.zone, "{}", case.name);
    }
}

/// Each rule of gcfg's value syntax, on a `secret-key` line.
#[test]
fn values_are_read_as_gcfg_reads_them() {
    let cases: &[(&str, &str, &str)] = &[
        ("plain", "secret-key = value", "value"),
        ("no spaces around =", "secret-key=value", "value"),
        (
            "blanks around the value",
            "secret-key =  \t value \t ",
            "value",
        ),
        ("indented name", "   secret-key = value", "value"),
        (
            "internal blanks kept",
            "secret-key = va  l\tue",
            "va  l\tue",
        ),
        ("name in any case", "SECRET-Key = value", "value"),
        (
            "comment after blank",
            "secret-key = value ; comment",
            "value",
        ),
        ("# comment", "secret-key = value # comment", "value"),
        ("glued ; cuts", "secret-key = value;rest", "value"),
        ("glued # cuts", "secret-key = value#rest", "value"),
        ("quoted ;", "secret-key = \"va ; lue\"", "va ; lue"),
        (
            "quoted # then comment",
            "secret-key = \"va # lue\" ; c",
            "va # lue",
        ),
        ("quoted blanks kept", "secret-key = \" value \"", " value "),
        ("two quoted parts", "secret-key = \"val\" \"ue\"", "val ue"),
        ("partly quoted", "secret-key = ab\"c;d\"ef", "abc;def"),
        ("escaped backslash", "secret-key = \"a\\\\b\"", "a\\b"),
        ("escaped quote", "secret-key = \"a\\\"b\"", "a\"b"),
        ("escaped newline", "secret-key = \"a\\nb\"", "a\nb"),
        ("escaped tab", "secret-key = \"a\\tb\"", "a\tb"),
        ("unquoted \\\"", "secret-key = \\\"value\\\"", "\"value\""),
        (
            "continuation",
            "secret-key = value \\\n value",
            "value  value",
        ),
        ("continuation, CRLF", "secret-key = abc\\\r\ndef", "abcdef"),
        (
            "continuation then comment",
            "secret-key = abc\\\n;def",
            "abc",
        ),
        ("CRLF", "secret-key = value\r", "value"),
        (
            "last of repeated keys",
            "secret-key = first\nsecret-key = second",
            "second",
        ),
    ];
    for (name, line, want) in cases {
        assert_eq!(secret_of(line).as_deref(), Ok(*want), "{name}: {line:?}");
    }
}

/// gcfg refuses these; the error names line 4 (or the line given) and what was wrong, and
/// never the secret.
#[test]
fn syntax_errors_name_the_line_and_never_the_secret() {
    let cases: &[(&str, &str, &[&str])] = &[
        ("secret-key = \"S3CR3T", "line 4", &["closing `\"`"]),
        (
            "secret-key = \"S3CR3T\nx = y\"",
            "line 4",
            &["closing `\"`"],
        ),
        (
            "secret-key = \"S3\\CR3T\"",
            "line 4",
            &["unknown escape", "`\\\\`"],
        ),
        (
            "secret-key = \"S3CR3T \\\n more\"",
            "line 4",
            &["unknown escape"],
        ),
        (
            "secret-key = S3\\CR3T",
            "line 4",
            &["outside double quotes", "`\\\\`"],
        ),
        (
            "secret_key = S3CR3T",
            "line 4",
            &["column 7", "`_`", "`secret-key`"],
        ),
        (
            "secret-key S3CR3T",
            "line 4",
            &["column 12", "expected `=`"],
        ),
        (
            "= S3CR3T",
            "line 4",
            &["column 1", "expected a [section] header"],
        ),
        ("\"S3CR3T\"", "line 4", &["column 1"]),
        ("[]", "line 4", &["section name"]),
        ("[Global \"\"]", "line 4", &["empty subsection"]),
        ("[Global \"S3CR3T]", "line 4", &["no closing"]),
        ("[Global \"S3\\nCR3T\"]", "line 4", &["only the escapes"]),
        ("[Global", "line 4", &["expected `]`"]),
        (
            "[Global] S3CR3T",
            "line 4",
            &["unexpected text after the section header"],
        ),
        ("secret-key = S3CR3T\0", "line 4", &["NUL"]),
        ("\nzone = z\nsecret-key = \"S3CR3T", "line 6", &["closing"]),
    ];
    for (line, at, needles) in cases {
        let err = secret_of(line).expect_err(line);
        assert!(err.contains("cloud-config c"), "{line:?}: {err}");
        assert!(err.contains(at), "{line:?}: {err} lacks {at:?}");
        for needle in *needles {
            assert!(err.contains(needle), "{line:?}: {err} lacks {needle:?}");
        }
        assert!(
            !err.contains("S3CR3T") && !err.contains("CR3T"),
            "{line:?}: {err}"
        );
    }
    // A backslash at the very end of the file continues nothing.
    let err = parse_cloud_config(&format!("{HEAD}secret-key = S3CR3T\\"), "c").unwrap_err();
    assert!(matches!(err, ConfigError::Syntax { line: 4, .. }), "{err}");
    assert!(!err.to_string().contains("S3CR3T"), "{err}");
    // Before any section.
    let err = parse_cloud_config("; c\nsecret-key = S3CR3T\n[Global]\n", "c").unwrap_err();
    assert!(matches!(err, ConfigError::Syntax { line: 2, .. }), "{err}");
    assert!(err.to_string().contains("[Global]") && !err.to_string().contains("S3CR3T"));
}

/// gcfg fills the in-tree `CSConfig`: string fields refuse a bare name, the boolean takes
/// eight words (or a bare name for true) and nothing else.
#[test]
fn keys_take_the_values_gcfg_gives_their_types() {
    for (word, want) in [
        ("true", true),
        ("tRuE", true),
        ("yes", true),
        ("on", true),
        ("1", true),
        ("\"true\"", true),
        ("false", false),
        ("NO", false),
        ("off", false),
        ("0", false),
        ("true ; comment", true),
    ] {
        let cfg = ok(&format!("{HEAD}secret-key = S\nssl-no-verify = {word}\n"));
        assert_eq!(cfg.ssl_no_verify, want, "{word}");
    }
    assert!(ok(&format!("{HEAD}secret-key = S\nssl-no-verify\n")).ssl_no_verify);
    assert!(ok(&format!("{HEAD}secret-key = S\nSSL-No-Verify ; c\n")).ssl_no_verify);
    for (word, needle) in [
        ("", "\"\""),
        ("maybe", "\"maybe\""),
        ("\" true\"", "\" true\""),
        ("t", "\"t\""),
        ("2", "\"2\""),
    ] {
        // A later valid value does not excuse the bad one: gcfg stops at the first.
        let text = format!("{HEAD}secret-key = S\nssl-no-verify = {word}\nssl-no-verify = true\n");
        let err = parse_cloud_config(&text, "c").expect_err(word);
        let ConfigError::InvalidValue {
            line, key, reason, ..
        } = &err
        else {
            panic!("{word}: {err}");
        };
        assert_eq!((*line, key.as_str()), (5, "ssl-no-verify"), "{word}");
        assert!(
            reason.contains(needle) && reason.contains("yes"),
            "{word}: {err}"
        );
    }
    for key in ["api-url", "api-key", "secret-key", "project-id", "zone"] {
        let text = format!("{HEAD}secret-key = S3CR3T\n{key}\n");
        let err = parse_cloud_config(&text, "c").expect_err(key);
        assert!(
            matches!(&err, ConfigError::InvalidValue { line: 5, key: k, .. } if k == key),
            "{key}: {err}"
        );
        assert!(err.to_string().contains("no `= value`"), "{err}");
        assert!(!err.to_string().contains("S3CR3T"), "{err}");
    }
    // Empty optional values are unset; a quoted value keeps its blanks.
    let cfg = ok(&format!(
        "{HEAD}secret-key = S\nzone = \"\"\nproject-id = \" p \"\n"
    ));
    assert_eq!((cfg.zone, cfg.project_id.as_deref()), (None, Some(" p ")));
}

#[test]
fn sections_and_subsections_follow_gcfg() {
    // A subsection of [Global] is not [Global]: gcfg does not store its keys there.
    let r = report(&format!(
        "{HEAD}secret-key = SK\n[Global \"extra\"]\nsecret-key = OTHER\n[global]\nzone = z\n"
    ));
    assert_eq!(
        (r.config.secret_key.as_str(), r.config.zone.as_deref()),
        ("SK", Some("z"))
    );
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("line 5") && w.contains("subsection")),
        "{:?}",
        r.warnings
    );
    // Only a subsection: there is no [Global].
    let err = parse_cloud_config("[Global \"x\"]\napi-key = a\n", "c").unwrap_err();
    assert!(matches!(err, ConfigError::MissingSection { .. }), "{err}");
    // Header spellings gcfg accepts.
    for header in [
        "[Global]",
        "[ Global ]",
        "[GLOBAL] ; c",
        "  [global]# c",
        "[Global]\r",
    ] {
        let text = format!("{header}\napi-url = {URL}\napi-key = AK\nsecret-key = SK\n");
        assert_eq!(ok(&text).secret_key, "SK", "{header}");
    }
    // Comment lines, blank lines and blanks-only lines anywhere.
    let text = format!(
        "\n ; one\n\t# two\n   \n[Global]\n;api-key = no\napi-url = {URL}\n# secret-key = no\n\
         api-key = AK\n\nsecret-key = SK\n  \n"
    );
    let cfg = ok(&text);
    assert_eq!(
        (cfg.api_key.as_str(), cfg.secret_key.as_str()),
        ("AK", "SK")
    );
}

/// Unknown keys and sections stay ignored (gcfg as the in-tree provider calls it refuses
/// them); each is a warning that names the line, never the value.
#[test]
fn unknown_keys_and_sections_warn_without_values() {
    let r = report(&format!(
        "{HEAD}secret-key = SK\nprojectid = V4LUE1\nregion = V4LUE2\n[LoadBalancer]\nsubnet = V4LUE3\n"
    ));
    assert_eq!(r.config.project_id, None);
    assert_eq!(r.warnings.len(), 3, "{:?}", r.warnings);
    assert!(
        r.warnings[0].contains("line 5") && r.warnings[0].contains("did you mean `project-id`?")
    );
    assert!(r.warnings[1].contains("line 6") && !r.warnings[1].contains("did you mean"));
    assert!(r.warnings[2].contains("line 7") && r.warnings[2].contains("[LoadBalancer]"));
    for w in &r.warnings {
        assert!(w.starts_with("cloud-config cloud-config line "), "{w}");
        assert!(!w.contains("V4LUE"), "{w}");
    }
    assert!(
        report(&format!("{HEAD}secret-key = SK\n"))
            .warnings
            .is_empty()
    );
}

/// A secret with an unquoted `;` or `#` is cut there, as gcfg cuts it. When the character
/// sits right after value text, the operator hears about it, without the secret.
#[test]
fn a_value_cut_at_a_comment_character_warns_without_the_secret() {
    let r = report(&format!("{HEAD}secret-key = Abc123;Def456\n"));
    assert_eq!(r.config.secret_key, "Abc123");
    let [w] = r.warnings.as_slice() else {
        panic!("{:?}", r.warnings);
    };
    for needle in ["line 4", "`secret-key`", "unquoted `;`", "double quotes"] {
        assert!(w.contains(needle), "{w} lacks {needle}");
    }
    assert!(!w.contains("Abc123") && !w.contains("Def456"), "{w}");

    let r = report(&format!(
        "{HEAD}secret-key = Abc123#Def456\napi-key = K#ey\n"
    ));
    assert_eq!(
        (r.config.secret_key.as_str(), r.config.api_key.as_str()),
        ("Abc123", "K")
    );
    assert_eq!(r.warnings.len(), 2, "{:?}", r.warnings);
    assert!(r.warnings[1].contains("`api-key`") && r.warnings[1].contains("`#`"));

    // A comment after a blank, or after a quoted value, is a comment: no warning.
    for line in [
        "secret-key = Abc123 ; note",
        "secret-key = \"Abc;123\"  # note",
    ] {
        assert!(
            report(&format!("{HEAD}{line}\n")).warnings.is_empty(),
            "{line}"
        );
    }
    // Cut to nothing: the missing-key error says why, still without the secret.
    let err = parse_cloud_config(&format!("{HEAD}secret-key = #Def456\n"), "c").unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, ConfigError::MissingKey { .. }), "{message}");
    assert!(
        message.contains("line 4") && message.contains("`#`"),
        "{message}"
    );
    assert!(!message.contains("Def456"), "{message}");
    let err = parse_cloud_config(&format!("{HEAD}secret-key =\n"), "c").unwrap_err();
    assert!(
        err.to_string().contains("line 4 sets it to an empty value"),
        "{err}"
    );
}

/// The warning reaches the log through `parse_cloud_config`, and the secret does not.
#[test]
fn cut_warnings_are_logged_without_the_secret() {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let capture = Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let cfg = tracing::subscriber::with_default(subscriber, || {
        ok(&format!("{HEAD}secret-key = Zq9xWv7;Lp2Mn8\n"))
    });
    assert_eq!(cfg.secret_key, "Zq9xWv7");
    let out =
        String::from_utf8_lossy(&capture.0.lock().unwrap_or_else(|p| p.into_inner())).to_string();
    assert!(
        out.contains("WARN") && out.contains("`secret-key`"),
        "{out}"
    );
    assert!(!out.contains("Zq9xWv7") && !out.contains("Lp2Mn8"), "{out}");
}

#[test]
fn cloud_config_errors_name_the_source_and_the_key() {
    let cases: [(&str, &str, &[&str]); 8] = [
        (
            "api-url = x\n",
            "no section",
            &["my.ini", "line 1", "[Global]"],
        ),
        ("", "empty file", &["my.ini", "[Global]"]),
        (
            "[Other]\napi-url = https://a/\n",
            "wrong section",
            &["my.ini", "[Global]"],
        ),
        (
            "[Global]\napi-key = a\nsecret-key = b\n",
            "no url",
            &["my.ini", "`api-url`", "missing"],
        ),
        (
            "[Global]\napi-url = https://a/\nsecret-key = b\n",
            "no key",
            &["my.ini", "`api-key`"],
        ),
        (
            "[Global]\napi-url = https://a/\napi-key = a\nsecret-key =\n",
            "empty secret",
            &["`secret-key`"],
        ),
        (
            "[Global]\napi-url = https://a/\napi-key = a\nsecret-key = b\nssl-no-verify = maybe\n",
            "bad bool",
            &["line 5", "`ssl-no-verify`", "maybe"],
        ),
        (
            "[Global]\napi-url = cloud.example.com\napi-key = a\nsecret-key = b\n",
            "bad url",
            &["line 2", "`api-url`", "invalid"],
        ),
    ];
    for (text, name, needles) in cases {
        let err = parse_cloud_config(text, "my.ini")
            .expect_err(name)
            .to_string();
        for needle in needles {
            assert!(err.contains(needle), "{name}: {err:?} lacks {needle:?}");
        }
    }
}

#[test]
fn invalid_value_errors_never_quote_secrets() {
    let err = parse_cloud_config(
        "[Global]\napi-url = ftp://x/\napi-key = AKEY\nsecret-key = SKEY\n",
        "f",
    )
    .unwrap_err()
    .to_string();
    assert!(!err.contains("SKEY") && !err.contains("AKEY"), "{err}");
}

#[test]
fn keys_from_elsewhere_override_or_fill_in() {
    let text = "[Global]\napi-url = https://cloud.example.com/client/api\n";
    assert!(matches!(
        parse_cloud_config(text, "f"),
        Err(ConfigError::MissingKey { key, .. }) if key == "api-key"
    ));
    let cfg =
        parse_cloud_config_with_keys(text, "f", Some("AK\n".into()), Some("SK".into())).unwrap();
    assert_eq!(
        (cfg.api_key.as_str(), cfg.secret_key.as_str()),
        ("AK", "SK")
    );

    let full =
        "[Global]\napi-url = https://cloud.example.com/client/api\napi-key = A\nsecret-key = S\n";
    let replaced = parse_cloud_config_with_keys(full, "f", None, Some("S2\n".into())).unwrap();
    assert_eq!(
        (replaced.api_key.as_str(), replaced.secret_key.as_str()),
        ("A", "S2")
    );
    assert_eq!(
        parse_cloud_config_with_keys(full, "f", Some(String::new()), None).unwrap(),
        ok(full),
        "an empty key from elsewhere leaves the file's"
    );
}

#[test]
fn debug_masks_secrets() {
    let cfg = ok(
        "[Global]\napi-url = https://cloud.example.com/client/api\napi-key = APIKEY123\n\
                  secret-key = TOPSECRET\nssl-no-verify = true\nproject-id = p\n",
    );
    let shown = format!("{cfg:?}");
    assert!(
        !shown.contains("TOPSECRET") && !shown.contains("APIKEY123"),
        "{shown}"
    );
    assert!(shown.contains("APIK…"), "{shown}");
}

#[test]
fn load_reads_a_file_and_names_it_in_errors() {
    let dir = std::env::temp_dir().join(format!("cks-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cloud-config");
    std::fs::write(
        &path,
        "[Global]\napi-url = https://cloud.example.com/client/api\napi-key = A\n",
    )
    .unwrap();
    let err = load_cloud_config_with_keys(&path, None, None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&path.display().to_string()) && err.contains("`secret-key`"),
        "{err}"
    );
    let cfg = load_cloud_config_with_keys(&path, None, Some("S".into())).unwrap();
    assert_eq!(cfg.secret_key, "S");
    let missing = dir.join("absent");
    let err = load_cloud_config_with_keys(&missing, None, None).unwrap_err();
    assert!(
        matches!(&err, ConfigError::Read { path, .. } if path.ends_with("absent")),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
