//! Time as the simulator sees it: a monotonic clock (milliseconds since start, driven by tokio so
//! paused-time tests work) and CloudStack's wall-clock date format (`2022-04-18T06:21:58+0000`).

use std::time::{SystemTime, UNIX_EPOCH};

/// Monotonic milliseconds since the simulator started.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    start: tokio::time::Instant,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Self {
            start: tokio::time::Instant::now(),
        }
    }

    pub(crate) fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// Now, in CloudStack's date format.
pub(crate) fn now_stamp() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format_stamp(secs)
}

/// Formats Unix seconds as `yyyy-MM-dd'T'HH:mm:ssZ` in UTC, the way CloudStack's API does.
pub(crate) fn format_stamp(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}+0000",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Parses the `expires` parameter of signature version 3: `2024-01-02T03:04:05+0000`,
/// `...+00:00`, `...Z`, optionally with fractional seconds. Returns Unix seconds.
pub(crate) fn parse_stamp(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 19
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d, h, mi, se) = (
        num(0..4)?,
        num(5..7)?,
        num(8..10)?,
        num(11..13)?,
        num(14..16)?,
        num(17..19)?,
    );
    let mut rest = &s[19..];
    if let Some(r) = rest.strip_prefix('.') {
        rest = r.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    let offset_secs = match rest {
        "Z" | "" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let digits: String = rest[1..].chars().filter(|c| *c != ':').collect();
            if digits.len() != 4 {
                return None;
            }
            let hh: i64 = digits[0..2].parse().ok()?;
            let mm: i64 = digits[2..4].parse().ok()?;
            sign * (hh * 3600 + mm * 60)
        }
    };
    Some(days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + se - offset_secs)
}

/// Parses a DATE parameter as CloudStack does (`ParamProcessWorker.setFieldValue`, case DATE,
/// for commands other than the event/alert/usage ones): `BaseCmd.INPUT_FORMAT` `yyyy-MM-dd`,
/// not lenient, with `DateFormat.parse(String)`, which reads from the start and ignores what
/// follows the day. So the time part of `2024-05-01T10:20:30+0000` is dropped. Returns Unix
/// seconds of that day's midnight, UTC (Java uses the management server's time zone; UTC here,
/// the usual server setting, *unverified*).
pub(crate) fn parse_date(s: &str) -> Option<i64> {
    fn number(s: &str) -> Option<(i64, &str)> {
        let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        if end == 0 || end > 9 {
            return None;
        }
        Some((s[..end].parse().ok()?, &s[end..]))
    }
    let (y, rest) = number(s)?;
    let (m, rest) = number(rest.strip_prefix('-')?)?;
    let (d, _) = number(rest.strip_prefix('-')?)?;
    let days_in_month = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if y % 4 == 0 && (y % 100 != 0 || y % 400 == 0) => 29,
        2 => 28,
        _ => return None,
    };
    if !(1..=days_in_month).contains(&d) {
        return None;
    }
    Some(days_from_civil(y, m, d) * 86_400)
}

pub(crate) fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

// Howard Hinnant's civil-date algorithms.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_cloudstack() {
        assert_eq!(format_stamp(1_650_262_918), "2022-04-18T06:21:58+0000");
    }

    #[test]
    fn parses_expires_forms() {
        assert_eq!(parse_stamp("2022-04-18T06:21:58+0000"), Some(1_650_262_918));
        assert_eq!(parse_stamp("2022-04-18T06:21:58Z"), Some(1_650_262_918));
        assert_eq!(
            parse_stamp("2022-04-18T08:21:58+02:00"),
            Some(1_650_262_918)
        );
        assert_eq!(parse_stamp("2022-04-18T06:21:58.123Z"), Some(1_650_262_918));
        assert_eq!(parse_stamp("yesterday"), None);
    }

    #[test]
    fn parses_date_parameters_like_java_yyyy_mm_dd() {
        let day = parse_date("2022-04-18").unwrap();
        assert_eq!(day, 1_650_240_000);
        assert_eq!(parse_date("2022-04-18T06:21:58+0000"), Some(day));
        assert_eq!(parse_date("2022-4-18"), Some(day));
        assert_eq!(parse_date("2024-02-29"), Some(1_709_164_800));
        for bad in [
            "yesterday",
            "2022-13-01",
            "2023-02-29",
            "2022-04",
            "20220418",
            "",
        ] {
            assert_eq!(parse_date(bad), None, "{bad}");
        }
    }
}
