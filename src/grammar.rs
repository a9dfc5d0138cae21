//! The value grammars every configuration source shares: durations and booleans, as written
//! in flags, environment variables, the `--config` file, `--node-group-options` overrides, the
//! probe's flags and the cloud-config. One grammar each, so a value that works in one place
//! works in all of them.
//!
//! A leaf: it depends on nothing else in the crate.

use std::time::Duration;

/// Longest duration accepted (about 31 years): anything longer is a typo, and keeping far
/// below `u64` seconds means sums and conversions elsewhere cannot overflow.
const MAX_SECS: u64 = 1_000_000_000;

const DURATION_FORM: &str = "use ms, s, m or h, e.g. 1500ms, 90s, 1.5m, 1h30m";

/// Parses a duration: one or more `<number><unit>` parts (Go's form: `300ms`, `1.5s`, `5m`,
/// `1h30m`) with units `ms`, `s`, `m`, `h`, or a bare number of seconds (`3`, `1.5`), which
/// the flags have always accepted. Errors quote the value.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let text = s.trim();
    if text.is_empty() {
        return Err(format!("empty duration ({DURATION_FORM})"));
    }
    let bad = |why: &str| format!("invalid duration {text:?}: {why} ({DURATION_FORM})");
    let mut nanos: u128 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(num_len);
        let unit_len = after
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        if num.is_empty() {
            return Err(bad("expected a number"));
        }
        let unit_nanos: u128 = match unit {
            // A bare number is seconds, but only as the whole value: `1h30` is a typo.
            "" if num_len == text.len() => 1_000_000_000,
            "" => return Err(bad(&format!("{num:?} needs a unit"))),
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            other => return Err(bad(&format!("unknown unit {other:?}"))),
        };
        let part = decimal_nanos(num, unit_nanos)
            .ok_or_else(|| bad(&format!("{num:?} is not a number")))?;
        nanos = nanos.saturating_add(part);
        if nanos > u128::from(MAX_SECS) * 1_000_000_000 {
            return Err(bad("too large"));
        }
        rest = after;
    }
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| bad("too large"))?;
    let sub = u32::try_from(nanos % 1_000_000_000).map_err(|_| bad("too large"))?;
    Ok(Duration::new(secs, sub))
}

/// `num` (digits with at most one `.`, at least one digit) times `unit_nanos`, exactly (no
/// floating point, so `0.1s` is 100ms to the nanosecond). Digits past the 18th after the point
/// are below a nanosecond for every unit and are dropped.
fn decimal_nanos(num: &str, unit_nanos: u128) -> Option<u128> {
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if (int.is_empty() && frac.is_empty()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u128 = if int.is_empty() {
        0
    } else {
        // More digits than u64 holds is "too large", caught by the caller's bound.
        int.parse::<u64>().map_or(u128::MAX, u128::from)
    };
    let frac = &frac[..frac.len().min(18)];
    let frac_nanos = if frac.is_empty() {
        0
    } else {
        let value: u128 = frac.parse().ok()?;
        value * unit_nanos / 10u128.pow(u32::try_from(frac.len()).ok()?)
    };
    Some(whole.saturating_mul(unit_nanos).saturating_add(frac_nanos))
}

/// The words [`parse_bool`] accepts, for error messages.
pub const BOOL_WORDS: &str = "true, yes, on, 1, false, no, off or 0 (any case)";

/// Parses a boolean as gcfg (the cloud-config's reader) does: one of eight words in any case,
/// nothing else (no surrounding spaces, not an empty value).
pub fn parse_bool(v: &str) -> Result<bool, String> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" => Ok(false),
        _ => Err(format!("{v:?} is not a boolean: use {BOOL_WORDS}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_every_accepted_form() {
        let ms = Duration::from_millis;
        for (text, want) in [
            ("2s", ms(2_000)),
            ("500ms", ms(500)),
            ("1500ms", ms(1_500)),
            ("5m", ms(300_000)),
            ("1h", ms(3_600_000)),
            ("1h30m", ms(5_400_000)),
            ("2m30s", ms(150_000)),
            ("1m0.5s", ms(60_500)),
            ("30m1h", ms(5_400_000)),
            ("1.5s", ms(1_500)),
            ("0.1s", ms(100)),
            (".5s", ms(500)),
            ("1.5h", ms(5_400_000)),
            ("0.25ms", Duration::from_micros(250)),
            ("3", ms(3_000)),
            ("1.5", ms(1_500)),
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            (" 10s ", ms(10_000)),
            ("1000000000s", Duration::from_secs(MAX_SECS)),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text:?}");
        }
    }

    #[test]
    fn bad_durations_are_refused_naming_the_value_and_the_fault() {
        for (text, needle) in [
            ("", "empty duration"),
            ("   ", "empty duration"),
            ("soon", "invalid duration \"soon\": expected a number"),
            ("5x", "unknown unit \"x\""),
            ("5d", "unknown unit \"d\""),
            ("5 s", "\"5\" needs a unit"),
            ("1h30", "\"30\" needs a unit"),
            ("-1s", "invalid duration \"-1s\""),
            ("+1s", "invalid duration \"+1s\""),
            ("1..5s", "\"1..5\" is not a number"),
            (".s", "\".\" is not a number"),
            ("1e3s", "unknown unit \"e\""),
            ("m", "expected a number"),
            ("1000000001s", "too large"),
            ("99999999999999999999s", "too large"),
            ("9999999999999999999999999h", "too large"),
        ] {
            let err = parse_duration(text).expect_err(text);
            assert!(err.contains(needle), "{text:?}: {err}");
            assert!(err.contains("ms, s, m or h"), "{text:?}: {err}");
        }
    }

    #[test]
    fn booleans_are_gcfgs_eight_words_in_any_case() {
        for (text, want) in [
            ("true", true),
            ("TRUE", true),
            ("Yes", true),
            ("on", true),
            ("1", true),
            ("false", false),
            ("No", false),
            ("OFF", false),
            ("0", false),
        ] {
            assert_eq!(parse_bool(text), Ok(want), "{text:?}");
        }
        for bad in ["", " true", "true ", "y", "2", "enabled"] {
            let err = parse_bool(bad).expect_err(bad);
            assert!(err.contains(&format!("{bad:?}")), "{err}");
            assert!(err.contains(BOOL_WORDS), "{err}");
        }
    }
}
