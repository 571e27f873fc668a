//! Properties of `next_after` for many random starting instants, and a check that the search is
//! not a second-by-second scan.

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use hexeract_cron::{parse_time_zone, Cron, Tz};

const EXPRESSIONS: &[&str] = &[
    "* * * * * *",
    "*/10 * * * * *",
    "0 */15 2 * * *",
    "0 30 2 * * *",
    "0 45 1 * * *",
    "0 0 * * * *",
    "0 */30 * * * *",
    "30 */7 1-3 * * *",
    "0 0 0 * * *",
    "0 0 0 29 2 *",
    "0 0 0 10 * MON",
    "0 0 9-17/2 * * MON-FRI",
    "0 0 0 31 * *",
];

const ZONES: &[&str] = &[
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Asia/Kolkata",
    "Australia/Lord_Howe",
    "America/Sao_Paulo",
    "Pacific/Apia",
];

/// Instants of clock changes, near which random starting points are concentrated.
const TRANSITIONS: &[&str] = &[
    "2026-03-29T01:00:00Z", // Europe/Berlin forward
    "2026-10-25T01:00:00Z", // Europe/Berlin back
    "2026-03-08T07:00:00Z", // America/New_York forward
    "2026-11-01T06:00:00Z", // America/New_York back
    "2026-04-04T15:00:00Z", // Australia/Lord_Howe back (30 minutes)
    "2026-10-03T15:30:00Z", // Australia/Lord_Howe forward (30 minutes)
    "2018-11-04T03:00:00Z", // America/Sao_Paulo forward at midnight
    "2019-02-17T02:00:00Z", // America/Sao_Paulo back at midnight
    "2011-12-30T10:00:00Z", // Pacific/Apia skips 2011-12-30
];

/// A small deterministic random number generator (SplitMix64), so failures are reproducible.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..bound`.
    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }

    /// A random instant with a random fraction of a second: near a clock change half of the
    /// time, anywhere in 2010-2030 otherwise.
    fn instant(&mut self) -> DateTime<Utc> {
        let nanos = self.below(1_000_000_000) as i64;
        if self.below(2) == 0 {
            let transition = instant(TRANSITIONS[self.below(TRANSITIONS.len() as u64) as usize]);
            let offset = self.below(6 * 3600) as i64 - 3 * 3600;
            transition + TimeDelta::seconds(offset) + TimeDelta::nanoseconds(nanos)
        } else {
            let start = Utc.with_ymd_and_hms(2010, 1, 1, 0, 0, 0).unwrap();
            let seconds = self.below(20 * 365 * 86_400) as i64;
            start + TimeDelta::seconds(seconds) + TimeDelta::nanoseconds(nanos)
        }
    }

    /// A random instant in `[from, to)`.
    fn between(&mut self, from: DateTime<Utc>, to: DateTime<Utc>) -> DateTime<Utc> {
        let span = (to - from).num_nanoseconds().unwrap();
        assert!(span > 0);
        from + TimeDelta::nanoseconds(self.below(span as u64) as i64)
    }
}

fn instant(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .unwrap()
        .with_timezone(&Utc)
}

fn iterate(cron: &Cron, tz: Tz, after: DateTime<Utc>, count: usize) -> Vec<DateTime<Utc>> {
    let mut times = Vec::with_capacity(count);
    let mut after = after;
    for _ in 0..count {
        let next = cron
            .next_after(after, tz)
            .expect("every expression here fires");
        times.push(next);
        after = next;
    }
    times
}

fn all_combinations() -> Vec<(Cron, Tz)> {
    let mut combinations = Vec::new();
    for expression in EXPRESSIONS {
        for zone in ZONES {
            combinations.push((
                Cron::parse(expression).unwrap(),
                parse_time_zone(zone).unwrap(),
            ));
        }
    }
    combinations
}

/// `next_after(t)` is a whole second after `t`, and no other fire time lies between them:
/// starting one second before it, or anywhere in between, gives it again.
#[test]
fn next_after_is_the_smallest_fire_time_after() {
    let mut random = Random(1);
    for (cron, tz) in all_combinations() {
        for _ in 0..40 {
            let t = random.instant();
            let next = cron.next_after(t, tz).unwrap();
            let context = format!("{cron} in {tz} after {t:?}");
            assert!(next > t, "{context}: {next:?}");
            assert_eq!(next.timestamp_subsec_nanos(), 0, "{context}");
            assert_eq!(
                cron.next_after(next - TimeDelta::seconds(1), tz),
                Some(next),
                "{context}"
            );
            assert_eq!(
                cron.next_after(next - TimeDelta::nanoseconds(1), tz),
                Some(next),
                "{context}"
            );
            let between = random.between(t, next);
            assert_eq!(cron.next_after(between, tz), Some(next), "{context}");
        }
    }
}

/// Iterating gives strictly increasing fire times, and iterating from a later point gives the
/// same fire times from there on.
#[test]
fn iterating_from_a_later_point_gives_the_rest_of_the_sequence() {
    let mut random = Random(2);
    for (cron, tz) in all_combinations() {
        for _ in 0..8 {
            let start = random.instant();
            let times = iterate(&cron, tz, start, 30);
            let context = format!("{cron} in {tz} from {start:?}");
            assert!(
                times.windows(2).all(|w| w[0] < w[1]),
                "{context}: {times:?}"
            );

            let later = random.between(start, times[15]);
            let from_later = iterate(&cron, tz, later, 10);
            let rest: Vec<_> = times.iter().copied().filter(|&t| t > later).collect();
            assert_eq!(
                &rest[..10],
                &from_later[..],
                "{context}, then from {later:?}"
            );
        }
    }
}

/// Every fire time is a local time that matches, or the end of a gap: its local time (to the
/// minute) is never before the matching local time it stands for. Here: the hour of the local
/// time of `0 30 2 * * *` is 2, or 3 on a day the clocks went forward over 02:30.
#[test]
fn fire_times_are_matching_local_times_or_the_end_of_a_gap() {
    let cron = Cron::parse("0 30 2 * * *").unwrap();
    for zone in ZONES {
        let tz = parse_time_zone(zone).unwrap();
        let start = Utc.with_ymd_and_hms(2018, 1, 1, 0, 0, 0).unwrap();
        for fire in iterate(&cron, tz, start, 3 * 366) {
            let local = fire.with_timezone(&tz).naive_local();
            let text = local.format("%H:%M:%S").to_string();
            assert!(
                text == "02:30:00" || text.starts_with("03:"),
                "{zone}: {fire:?} is {local} local"
            );
        }
    }
}

/// Not a benchmark: these only finish quickly because the search jumps field by field. A
/// second-by-second scan would need 8 years of seconds (about 250 million steps) for each
/// February 29 across 2100.
#[test]
fn the_search_is_not_a_scan() {
    let tz = parse_time_zone("Europe/Berlin").unwrap();
    let every_second = Cron::parse("*/1 * * * * *").unwrap();
    let start = Utc.with_ymd_and_hms(2026, 3, 29, 0, 0, 0).unwrap();
    let times = iterate(&every_second, tz, start, 10_000);
    // The clocks go forward in this window, which removes no instant.
    assert_eq!(*times.last().unwrap(), start + TimeDelta::seconds(10_000));

    let leap_day = Cron::parse("0 0 0 29 2 *").unwrap();
    let start = Utc.with_ymd_and_hms(2090, 1, 1, 0, 0, 0).unwrap();
    let times = iterate(&leap_day, Tz::UTC, start, 4);
    let expected: Vec<_> = [2092, 2096, 2104, 2108]
        .iter()
        .map(|&year| Utc.with_ymd_and_hms(year, 2, 29, 0, 0, 0).unwrap())
        .collect();
    assert_eq!(times, expected);
    let times = iterate(&leap_day, tz, start, 4);
    assert_eq!(
        times,
        expected
            .iter()
            .map(|t| *t - TimeDelta::hours(1))
            .collect::<Vec<_>>()
    );
}
