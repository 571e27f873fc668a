//! Fixed-period (`every`) schedules.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// The next fire time of a schedule that fires every `period`: the first multiple of `period`,
/// counted from the Unix epoch (1970-01-01T00:00:00Z), strictly after `after`.
///
/// Counting from the epoch rather than from when a process started means every replica
/// computes the same fire times. The resolution is one millisecond: `period` is truncated to
/// whole milliseconds.
///
/// # Panics
///
/// When `period` is shorter than one millisecond, and when the fire time is beyond what
/// `chrono` can represent (after the year 262 000, for a period of thousands of years).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use chrono::{TimeZone, Utc};
/// use hexeract_cron::every_next_after;
///
/// let after = Utc.with_ymd_and_hms(2026, 1, 1, 10, 0, 5).unwrap();
/// let next = every_next_after(Duration::from_secs(30), after);
/// assert_eq!(next, Utc.with_ymd_and_hms(2026, 1, 1, 10, 0, 30).unwrap());
/// // Strictly after: a fire time gives the next one.
/// let after_that = every_next_after(Duration::from_secs(30), next);
/// assert_eq!(after_that, Utc.with_ymd_and_hms(2026, 1, 1, 10, 1, 0).unwrap());
/// ```
#[must_use]
pub fn every_next_after(period: Duration, after: DateTime<Utc>) -> DateTime<Utc> {
    let period_ms = i128::try_from(period.as_millis())
        .expect("a Duration in milliseconds always fits in an i128");
    assert!(
        period_ms > 0,
        "every_next_after: the period must be at least 1 millisecond, got {period:?}"
    );
    // Milliseconds since the epoch, rounded down (towards the past, also before 1970).
    let after_ms = i128::from(after.timestamp_millis());
    let next_ms = (after_ms.div_euclid(period_ms) + 1) * period_ms;
    i64::try_from(next_ms)
        .ok()
        .and_then(DateTime::from_timestamp_millis)
        .unwrap_or_else(|| {
            panic!("every_next_after: the fire time after {after} every {period:?} is out of range")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_millisecond_parts_are_ignored() {
        let after = DateTime::from_timestamp(100, 999_999).unwrap();
        // 100.000999 s rounds down to 100.000 s; the next multiple of 1 ms is 100.001 s.
        let next = every_next_after(Duration::from_micros(1_500), after);
        assert_eq!(next, DateTime::from_timestamp_millis(100_001).unwrap());
    }

    #[test]
    fn before_the_epoch_counts_from_the_epoch_too() {
        let after = DateTime::from_timestamp(-45, 0).unwrap();
        let next = every_next_after(Duration::from_secs(30), after);
        assert_eq!(next, DateTime::from_timestamp(-30, 0).unwrap());
    }

    #[test]
    #[should_panic(expected = "the period must be at least 1 millisecond")]
    fn zero_period_panics() {
        let _ = every_next_after(Duration::ZERO, DateTime::from_timestamp(0, 0).unwrap());
    }

    #[test]
    #[should_panic(expected = "the period must be at least 1 millisecond")]
    fn sub_millisecond_period_panics() {
        let _ = every_next_after(
            Duration::from_micros(999),
            DateTime::from_timestamp(0, 0).unwrap(),
        );
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn huge_period_panics() {
        let _ = every_next_after(Duration::MAX, DateTime::from_timestamp(0, 0).unwrap());
    }
}
