//! UTC civil time for access-log timestamps, without crates: days since the epoch → proleptic
//! Gregorian date (Howard Hinnant's `civil_from_days`), formatted as the service's
//! `datetime.isoformat(timespec="milliseconds")` of a UTC time: `2026-11-22T10:04:05.123+00:00`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `(year, month 1–12, day 1–31)` of the day `days` after 1970-01-01 (negative = before).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March = 0
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `YYYY-MM-DDTHH:MM:SS.mmm+00:00` for a time `since_epoch` after 1970-01-01T00:00:00Z
/// (milliseconds truncated, as Python's `isoformat(timespec="milliseconds")`).
pub fn iso_utc_millis(since_epoch: Duration) -> String {
    let secs = since_epoch.as_secs() as i64;
    let millis = since_epoch.subsec_millis();
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}+00:00",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// [`iso_utc_millis`] of the current wall-clock time (the epoch if the clock is before it).
pub fn now_iso_utc_millis() -> String {
    iso_utc_millis(SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64, millis: u32) -> String {
        iso_utc_millis(Duration::new(secs, millis * 1_000_000))
    }

    #[test]
    fn known_instants() {
        // expected values from Python: datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000+00:00");
        assert_eq!(at(951_782_400, 0), "2000-02-29T00:00:00.000+00:00");
        assert_eq!(at(1_795_334_645, 123), "2026-11-22T08:04:05.123+00:00");
        assert_eq!(at(1_709_164_800, 0), "2024-02-29T00:00:00.000+00:00");
        assert_eq!(at(4_102_444_800, 0), "2100-01-01T00:00:00.000+00:00");
        assert_eq!(at(1_234_567_890, 999), "2009-02-13T23:31:30.999+00:00");
        assert_eq!(at(253_402_300_799, 0), "9999-12-31T23:59:59.000+00:00");
        // sub-millisecond parts are truncated
        assert_eq!(
            iso_utc_millis(Duration::new(86_399, 999_999_999)),
            "1970-01-01T23:59:59.999+00:00"
        );
    }

    #[test]
    fn civil_dates_follow_the_calendar() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(59), (1970, 3, 1)); // 1970 is not a leap year
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(11_017), (2000, 3, 1));
        assert_eq!(civil_from_days(47_540), (2100, 2, 28)); // 2100 is not a leap year
        assert_eq!(civil_from_days(47_541), (2100, 3, 1));
        // consecutive days across 1970..2400 step by exactly one calendar day
        let mut prev = civil_from_days(0);
        let month_len = |y: i64, m: u32| match m {
            2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        for days in 1..157_000 {
            let cur = civil_from_days(days);
            let (y, m, d) = prev;
            let expected = if d < month_len(y, m) {
                (y, m, d + 1)
            } else if m < 12 {
                (y, m + 1, 1)
            } else {
                (y + 1, 1, 1)
            };
            assert_eq!(cur, expected, "day {days}");
            prev = cur;
        }
    }

    #[test]
    fn now_is_well_formed() {
        let s = now_iso_utc_millis();
        assert_eq!(s.len(), 29, "{s}");
        assert!(s.ends_with("+00:00") && s.as_bytes()[10] == b'T' && s.as_bytes()[19] == b'.');
    }
}
