//! `every_next_after`: multiples of the period counted from the Unix epoch.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use hexeract_cron::every_next_after;

fn instant(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .unwrap()
        .with_timezone(&Utc)
}

fn format(instant: DateTime<Utc>) -> String {
    instant.to_rfc3339_opts(SecondsFormat::Millis, true)
}

#[test]
fn next_multiples_of_the_period() {
    // (period, after, expected)
    let cases = [
        (
            Duration::from_secs(30),
            "2026-01-01T10:00:05Z",
            "2026-01-01T10:00:30.000Z",
        ),
        (
            Duration::from_secs(30),
            "2026-01-01T10:00:29.999Z",
            "2026-01-01T10:00:30.000Z",
        ),
        // Exactly on a fire time: the next one, strictly after.
        (
            Duration::from_secs(30),
            "2026-01-01T10:00:30Z",
            "2026-01-01T10:01:00.000Z",
        ),
        // A nanosecond past a fire time.
        (
            Duration::from_secs(30),
            "2026-01-01T10:00:30.000000001Z",
            "2026-01-01T10:01:00.000Z",
        ),
        (
            Duration::from_secs(3600),
            "2026-01-01T10:59:59Z",
            "2026-01-01T11:00:00.000Z",
        ),
        (
            Duration::from_secs(3600),
            "2026-01-01T11:00:00Z",
            "2026-01-01T12:00:00.000Z",
        ),
        // 1.5 s: the multiples of 1500 ms since the epoch; 2026-01-01T00:00:00Z is
        // 1 767 225 600 000 ms, itself a multiple of 1500.
        (
            Duration::from_millis(1500),
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:00:01.500Z",
        ),
        (
            Duration::from_millis(1500),
            "2026-01-01T00:00:01.500Z",
            "2026-01-01T00:00:03.000Z",
        ),
        (
            Duration::from_millis(1500),
            "2026-01-01T00:00:02.250Z",
            "2026-01-01T00:00:03.000Z",
        ),
        // 7 s does not divide a day: the fire times do not restart at midnight.
        // 2026-01-02T00:00:00Z is 6 s past a multiple of 7 s.
        (
            Duration::from_secs(7),
            "2026-01-01T23:59:58Z",
            "2026-01-02T00:00:01.000Z",
        ),
        // A day: midnight UTC.
        (
            Duration::from_secs(86_400),
            "2026-03-29T01:30:00Z",
            "2026-03-30T00:00:00.000Z",
        ),
        (
            Duration::from_millis(1),
            "2026-01-01T00:00:00.0004Z",
            "2026-01-01T00:00:00.001Z",
        ),
    ];
    for (period, after, expected) in cases {
        let next = every_next_after(period, instant(after));
        assert_eq!(format(next), expected, "every {period:?} after {after}");
    }
}

#[test]
fn fire_times_do_not_depend_on_the_starting_point() {
    let period = Duration::from_millis(1500);
    let mut from_early = vec![every_next_after(
        period,
        instant("2026-05-05T05:05:05.123Z"),
    )];
    for _ in 0..100 {
        from_early.push(every_next_after(period, *from_early.last().unwrap()));
    }
    let later = instant("2026-05-05T05:05:33.001Z");
    let first_from_later = every_next_after(period, later);
    let expected = from_early.iter().copied().find(|&t| t > later).unwrap();
    assert_eq!(first_from_later, expected);
    for pair in from_early.windows(2) {
        assert_eq!(pair[1] - pair[0], TimeDelta::milliseconds(1500));
        assert_eq!(pair[0].timestamp_millis() % 1500, 0);
    }
}
