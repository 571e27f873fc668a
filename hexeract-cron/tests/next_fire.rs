//! The next fire times of cron expressions, as a table: expression, time zone, a starting
//! instant, and the fire times that iterating `next_after` from it must give, in order.

use chrono::{DateTime, SecondsFormat, Utc};
use hexeract_cron::{parse_time_zone, Cron};

struct Case {
    expression: &'static str,
    zone: &'static str,
    after: &'static str,
    expected: &'static [&'static str],
}

const CASES: &[Case] = &[
    // ---- The seconds field ------------------------------------------------------------------
    Case {
        expression: "*/10 * * * * *",
        zone: "UTC",
        after: "2026-01-01T00:00:00Z",
        expected: &[
            "2026-01-01T00:00:10Z",
            "2026-01-01T00:00:20Z",
            "2026-01-01T00:00:30Z",
            "2026-01-01T00:00:40Z",
            "2026-01-01T00:00:50Z",
            "2026-01-01T00:01:00Z",
        ],
    },
    // A start with a fraction of a second.
    Case {
        expression: "*/10 * * * * *",
        zone: "UTC",
        after: "2026-01-01T00:00:09.999Z",
        expected: &["2026-01-01T00:00:10Z", "2026-01-01T00:00:20Z"],
    },
    Case {
        expression: "*/10 * * * * *",
        zone: "UTC",
        after: "2026-01-01T00:00:10.001Z",
        expected: &["2026-01-01T00:00:20Z"],
    },
    Case {
        expression: "5,35 * * * * *",
        zone: "UTC",
        after: "2026-01-01T00:00:35Z",
        expected: &[
            "2026-01-01T00:01:05Z",
            "2026-01-01T00:01:35Z",
            "2026-01-01T00:02:05Z",
        ],
    },
    Case {
        expression: "* * * * * *",
        zone: "UTC",
        after: "2026-01-01T00:00:00Z",
        expected: &[
            "2026-01-01T00:00:01Z",
            "2026-01-01T00:00:02Z",
            "2026-01-01T00:00:03Z",
        ],
    },
    // ---- Ranges, steps and names ------------------------------------------------------------
    // 2026-01-02 is a Friday.
    Case {
        expression: "0 0 9-17/2 * * MON-FRI",
        zone: "UTC",
        after: "2026-01-02T16:00:00Z",
        expected: &[
            "2026-01-02T17:00:00Z",
            "2026-01-05T09:00:00Z",
            "2026-01-05T11:00:00Z",
            "2026-01-05T13:00:00Z",
            "2026-01-05T15:00:00Z",
            "2026-01-05T17:00:00Z",
            "2026-01-06T09:00:00Z",
        ],
    },
    Case {
        expression: "0 15,45 8-9 * * *",
        zone: "UTC",
        after: "2026-01-01T08:15:00Z",
        expected: &[
            "2026-01-01T08:45:00Z",
            "2026-01-01T09:15:00Z",
            "2026-01-01T09:45:00Z",
            "2026-01-02T08:15:00Z",
        ],
    },
    Case {
        expression: "0 0 0 1 JAN,jul *",
        zone: "UTC",
        after: "2026-03-01T00:00:00Z",
        expected: &[
            "2026-07-01T00:00:00Z",
            "2027-01-01T00:00:00Z",
            "2027-07-01T00:00:00Z",
        ],
    },
    // 2026-01-03 is a Saturday.
    Case {
        expression: "0 0 12 * * sat,Sun",
        zone: "UTC",
        after: "2026-01-01T00:00:00Z",
        expected: &[
            "2026-01-03T12:00:00Z",
            "2026-01-04T12:00:00Z",
            "2026-01-10T12:00:00Z",
            "2026-01-11T12:00:00Z",
        ],
    },
    // 7 is Sunday too; FRI-SUN ends on Sunday.
    Case {
        expression: "0 0 12 * * 7",
        zone: "UTC",
        after: "2026-01-01T00:00:00Z",
        expected: &["2026-01-04T12:00:00Z", "2026-01-11T12:00:00Z"],
    },
    Case {
        expression: "0 0 12 * * FRI-SUN",
        zone: "UTC",
        after: "2026-01-01T00:00:00Z",
        expected: &[
            "2026-01-02T12:00:00Z",
            "2026-01-03T12:00:00Z",
            "2026-01-04T12:00:00Z",
            "2026-01-09T12:00:00Z",
        ],
    },
    Case {
        expression: "0 0 0 1 */4 *",
        zone: "UTC",
        after: "2026-01-01T00:00:00Z",
        expected: &[
            "2026-05-01T00:00:00Z",
            "2026-09-01T00:00:00Z",
            "2027-01-01T00:00:00Z",
        ],
    },
    // ---- Day of month and day of week -------------------------------------------------------
    // Both restricted: either one. 2026-06-01 is a Monday, 2026-06-10 a Wednesday.
    Case {
        expression: "0 0 0 10 * MON",
        zone: "UTC",
        after: "2026-06-01T00:00:00Z",
        expected: &[
            "2026-06-08T00:00:00Z",
            "2026-06-10T00:00:00Z",
            "2026-06-15T00:00:00Z",
            "2026-06-22T00:00:00Z",
            "2026-06-29T00:00:00Z",
            "2026-07-06T00:00:00Z",
            "2026-07-10T00:00:00Z",
        ],
    },
    // Day of week is `*`: only the day of month counts.
    Case {
        expression: "0 0 0 10 * *",
        zone: "UTC",
        after: "2026-06-01T00:00:00Z",
        expected: &["2026-06-10T00:00:00Z", "2026-07-10T00:00:00Z"],
    },
    // Day of month is `*`: only the day of week counts.
    Case {
        expression: "0 0 0 * * MON",
        zone: "UTC",
        after: "2026-06-01T00:00:00Z",
        expected: &["2026-06-08T00:00:00Z", "2026-06-15T00:00:00Z"],
    },
    // `*/1` is a restriction (only a literal `*` is not), so the rule is "either": every day.
    Case {
        expression: "0 0 0 */1 * MON",
        zone: "UTC",
        after: "2026-06-01T00:00:00Z",
        expected: &["2026-06-02T00:00:00Z", "2026-06-03T00:00:00Z"],
    },
    // ---- Month ends, leap days, year rollover -----------------------------------------------
    Case {
        expression: "0 0 0 31 * *",
        zone: "UTC",
        after: "2026-01-31T00:00:00Z",
        expected: &[
            "2026-03-31T00:00:00Z",
            "2026-05-31T00:00:00Z",
            "2026-07-31T00:00:00Z",
            "2026-08-31T00:00:00Z",
            "2026-10-31T00:00:00Z",
            "2026-12-31T00:00:00Z",
            "2027-01-31T00:00:00Z",
        ],
    },
    Case {
        expression: "0 0 0 30 * *",
        zone: "UTC",
        after: "2026-01-30T00:00:00Z",
        expected: &["2026-03-30T00:00:00Z", "2026-04-30T00:00:00Z"],
    },
    Case {
        expression: "0 0 12 29 2 *",
        zone: "UTC",
        after: "2025-01-01T00:00:00Z",
        expected: &["2028-02-29T12:00:00Z", "2032-02-29T12:00:00Z"],
    },
    // 2100 is not a leap year.
    Case {
        expression: "0 0 12 29 2 *",
        zone: "UTC",
        after: "2096-03-01T00:00:00Z",
        expected: &["2104-02-29T12:00:00Z", "2108-02-29T12:00:00Z"],
    },
    // 2000 is one.
    Case {
        expression: "0 0 12 29 2 *",
        zone: "UTC",
        after: "1997-01-01T00:00:00Z",
        expected: &["2000-02-29T12:00:00Z", "2004-02-29T12:00:00Z"],
    },
    Case {
        expression: "0 0 0 * 2 *",
        zone: "UTC",
        after: "2028-02-27T12:00:00Z",
        expected: &[
            "2028-02-28T00:00:00Z",
            "2028-02-29T00:00:00Z",
            "2029-02-01T00:00:00Z",
        ],
    },
    Case {
        expression: "* * * * * *",
        zone: "UTC",
        after: "2026-12-31T23:59:59Z",
        expected: &["2027-01-01T00:00:00Z"],
    },
    Case {
        expression: "0 0 0 1 1 *",
        zone: "UTC",
        after: "2026-12-31T23:59:59Z",
        expected: &["2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z"],
    },
    Case {
        expression: "59 59 23 31 12 *",
        zone: "UTC",
        after: "2026-12-31T23:59:59Z",
        expected: &["2027-12-31T23:59:59Z"],
    },
    Case {
        expression: "59 59 23 31 12 *",
        zone: "UTC",
        after: "2026-12-31T23:59:58Z",
        expected: &["2026-12-31T23:59:59Z", "2027-12-31T23:59:59Z"],
    },
    // ---- Europe/Berlin: clocks go forward 2026-03-29 at 01:00Z (02:00 CET -> 03:00 CEST) ----
    // 02:30 does not happen that day: the job runs at the end of the gap, 03:00 CEST.
    Case {
        expression: "0 30 2 * * *",
        zone: "Europe/Berlin",
        after: "2026-03-27T12:00:00Z",
        expected: &[
            "2026-03-28T01:30:00Z",
            "2026-03-29T01:00:00Z",
            "2026-03-30T00:30:00Z",
        ],
    },
    // Four matching local times in the gap are one fire time.
    Case {
        expression: "0 */15 2 * * *",
        zone: "Europe/Berlin",
        after: "2026-03-28T00:00:00Z",
        expected: &[
            "2026-03-28T01:00:00Z",
            "2026-03-28T01:15:00Z",
            "2026-03-28T01:30:00Z",
            "2026-03-28T01:45:00Z",
            "2026-03-29T01:00:00Z",
            "2026-03-30T00:00:00Z",
            "2026-03-30T00:15:00Z",
            "2026-03-30T00:30:00Z",
            "2026-03-30T00:45:00Z",
            "2026-03-31T00:00:00Z",
        ],
    },
    // 02:00 (in the gap) and 03:00 (the end of the gap) are the same instant.
    Case {
        expression: "0 0 * * * *",
        zone: "Europe/Berlin",
        after: "2026-03-28T23:30:00Z",
        expected: &[
            "2026-03-29T00:00:00Z",
            "2026-03-29T01:00:00Z",
            "2026-03-29T02:00:00Z",
        ],
    },
    // Starting at the end of the gap.
    Case {
        expression: "0 */15 2 * * *",
        zone: "Europe/Berlin",
        after: "2026-03-29T01:00:00Z",
        expected: &["2026-03-30T00:00:00Z"],
    },
    Case {
        expression: "0 */15 2 * * *",
        zone: "Europe/Berlin",
        after: "2026-03-29T00:59:59Z",
        expected: &["2026-03-29T01:00:00Z", "2026-03-30T00:00:00Z"],
    },
    // ---- Europe/Berlin: clocks go back 2026-10-25 at 01:00Z (03:00 CEST -> 02:00 CET) -------
    // 02:30 happens twice: the job runs at the first one only.
    Case {
        expression: "0 30 2 * * *",
        zone: "Europe/Berlin",
        after: "2026-10-24T12:00:00Z",
        expected: &["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"],
    },
    Case {
        expression: "0 */15 2 * * *",
        zone: "Europe/Berlin",
        after: "2026-10-24T12:00:00Z",
        expected: &[
            "2026-10-25T00:00:00Z",
            "2026-10-25T00:15:00Z",
            "2026-10-25T00:30:00Z",
            "2026-10-25T00:45:00Z",
            "2026-10-26T01:00:00Z",
            "2026-10-26T01:15:00Z",
        ],
    },
    // Starting inside the second 02:00-03:00 (01:10Z is 02:10 CET): the same later fire times.
    Case {
        expression: "0 */15 2 * * *",
        zone: "Europe/Berlin",
        after: "2026-10-25T01:10:00Z",
        expected: &["2026-10-26T01:00:00Z", "2026-10-26T01:15:00Z"],
    },
    Case {
        expression: "0 30 2 * * *",
        zone: "Europe/Berlin",
        after: "2026-10-25T01:10:00Z",
        expected: &["2026-10-26T01:30:00Z"],
    },
    Case {
        expression: "0 30 2 * * *",
        zone: "Europe/Berlin",
        after: "2026-10-25T00:30:00Z",
        expected: &["2026-10-26T01:30:00Z"],
    },
    // Hourly: the second 02:00 (01:00Z) is not a fire time.
    Case {
        expression: "0 0 * * * *",
        zone: "Europe/Berlin",
        after: "2026-10-24T22:30:00Z",
        expected: &[
            "2026-10-24T23:00:00Z",
            "2026-10-25T00:00:00Z",
            "2026-10-25T02:00:00Z",
            "2026-10-25T03:00:00Z",
        ],
    },
    // Outside the transitions, local midnight is 23:00Z in winter and 22:00Z in summer.
    Case {
        expression: "0 0 0 * * *",
        zone: "Europe/Berlin",
        after: "2026-03-28T00:00:00Z",
        expected: &["2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z"],
    },
    // ---- America/New_York: forward 2026-03-08 at 07:00Z, back 2026-11-01 at 06:00Z -----------
    Case {
        expression: "0 30 2 * * *",
        zone: "America/New_York",
        after: "2026-03-07T00:00:00Z",
        expected: &[
            "2026-03-07T07:30:00Z",
            "2026-03-08T07:00:00Z",
            "2026-03-09T06:30:00Z",
        ],
    },
    Case {
        expression: "0 30 1 * * *",
        zone: "America/New_York",
        after: "2026-10-31T12:00:00Z",
        expected: &["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"],
    },
    // 06:00Z is 01:00 EST, the second 01:00.
    Case {
        expression: "0 30 1 * * *",
        zone: "America/New_York",
        after: "2026-11-01T06:00:00Z",
        expected: &["2026-11-02T06:30:00Z"],
    },
    Case {
        expression: "0 0 9 * * MON-FRI",
        zone: "America/New_York",
        after: "2026-03-06T00:00:00Z",
        expected: &["2026-03-06T14:00:00Z", "2026-03-09T13:00:00Z"],
    },
    // ---- Asia/Kolkata: UTC+05:30 ----------------------------------------------------------------
    Case {
        expression: "0 0 9 * * MON-FRI",
        zone: "Asia/Kolkata",
        after: "2026-01-02T00:00:00Z",
        expected: &["2026-01-02T03:30:00Z", "2026-01-05T03:30:00Z"],
    },
    // Every local full hour is half past a UTC hour.
    Case {
        expression: "0 0 * * * *",
        zone: "Asia/Kolkata",
        after: "2026-01-01T00:00:00Z",
        expected: &["2026-01-01T00:30:00Z", "2026-01-01T01:30:00Z"],
    },
    // Local midnight on the first of the month is the previous day in UTC.
    Case {
        expression: "0 0 0 1 * *",
        zone: "Asia/Kolkata",
        after: "2026-01-01T00:00:00Z",
        expected: &["2026-01-31T18:30:00Z", "2026-02-28T18:30:00Z"],
    },
    // ---- Australia/Lord_Howe: 30-minute DST shift ---------------------------------------------
    // Back 2026-04-05 02:00 (+11:00) -> 01:30 (+10:30), at 2026-04-04T15:00Z: 01:45 happens
    // twice, the job runs at the first one.
    Case {
        expression: "0 45 1 * * *",
        zone: "Australia/Lord_Howe",
        after: "2026-04-03T00:00:00Z",
        expected: &[
            "2026-04-03T14:45:00Z",
            "2026-04-04T14:45:00Z",
            "2026-04-05T15:15:00Z",
        ],
    },
    // Forward 2026-10-04 02:00 (+10:30) -> 02:30 (+11:00), at 2026-10-03T15:30Z.
    Case {
        expression: "0 15 2 * * *",
        zone: "Australia/Lord_Howe",
        after: "2026-10-02T00:00:00Z",
        expected: &[
            "2026-10-02T15:45:00Z",
            "2026-10-03T15:30:00Z",
            "2026-10-04T15:15:00Z",
        ],
    },
    // 02:00, 02:10, 02:20 (in the gap) and 02:30 (its end) are one fire time.
    Case {
        expression: "0 */10 2 * * *",
        zone: "Australia/Lord_Howe",
        after: "2026-10-03T12:00:00Z",
        expected: &[
            "2026-10-03T15:30:00Z",
            "2026-10-03T15:40:00Z",
            "2026-10-03T15:50:00Z",
            "2026-10-04T15:00:00Z",
        ],
    },
    // ---- Clock changes at midnight and a skipped day -------------------------------------------
    // America/Sao_Paulo went forward 2018-11-04 at 00:00 (-03:00 -> -02:00): that midnight
    // did not happen, the job ran at 01:00 local.
    Case {
        expression: "0 0 0 * * *",
        zone: "America/Sao_Paulo",
        after: "2018-11-02T12:00:00Z",
        expected: &[
            "2018-11-03T03:00:00Z",
            "2018-11-04T03:00:00Z",
            "2018-11-05T02:00:00Z",
        ],
    },
    // ... and back 2019-02-17 at 00:00 (-02:00 -> -03:00): 23:30 on 2019-02-16 happened twice.
    Case {
        expression: "0 30 23 * * *",
        zone: "America/Sao_Paulo",
        after: "2019-02-15T12:00:00Z",
        expected: &[
            "2019-02-16T01:30:00Z",
            "2019-02-17T01:30:00Z",
            "2019-02-18T02:30:00Z",
        ],
    },
    // Pacific/Apia skipped 2011-12-30 (from -10:00 to +14:00 at 2011-12-30T10:00Z): noon on
    // that day fires at the end of the gap, midnight local on 2011-12-31.
    Case {
        expression: "0 0 12 * * *",
        zone: "Pacific/Apia",
        after: "2011-12-28T23:00:00Z",
        expected: &[
            "2011-12-29T22:00:00Z",
            "2011-12-30T10:00:00Z",
            "2011-12-30T22:00:00Z",
        ],
    },
];

fn instant(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|e| panic!("bad instant {text:?} in the table: {e}"))
        .with_timezone(&Utc)
}

fn format(instant: DateTime<Utc>) -> String {
    instant.to_rfc3339_opts(SecondsFormat::Secs, true)
}

#[test]
fn next_fire_times() {
    let mut failures = Vec::new();
    for case in CASES {
        let cron = Cron::parse(case.expression).unwrap();
        let tz = parse_time_zone(case.zone).unwrap();
        let mut after = instant(case.after);
        let mut found = Vec::new();
        for _ in case.expected {
            let Some(next) = cron.next_after(after, tz) else {
                break;
            };
            found.push(format(next));
            after = next;
        }
        if found != case.expected {
            failures.push(format!(
                "{:?} in {} after {}:\n  expected {:?}\n  found    {:?}",
                case.expression, case.zone, case.after, case.expected, found
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Each row, started from one second before each of its fire times, gives that fire time.
#[test]
fn one_second_before_a_fire_time_gives_it() {
    for case in CASES {
        let cron = Cron::parse(case.expression).unwrap();
        let tz = parse_time_zone(case.zone).unwrap();
        for expected in case.expected {
            let fire = instant(expected);
            let next = cron.next_after(fire - chrono::TimeDelta::seconds(1), tz);
            assert_eq!(
                next.map(format).as_deref(),
                Some(*expected),
                "{:?} in {}",
                case.expression,
                case.zone
            );
        }
    }
}

#[test]
fn utc_and_the_parsed_utc_zone_agree() {
    let cron = Cron::parse("0 */7 * * * *").unwrap();
    let mut after = instant("2026-01-01T00:00:00Z");
    for _ in 0..100 {
        let a = cron.next_after(after, hexeract_cron::Tz::UTC).unwrap();
        let b = cron
            .next_after(after, parse_time_zone("Etc/UTC").unwrap())
            .unwrap();
        assert_eq!(a, b);
        after = a;
    }
}
