//! Parsing cron expressions and computing their fire times.

use std::fmt;
use std::str::FromStr;

use chrono::offset::LocalResult;
use chrono::{
    DateTime, Datelike, NaiveDate, NaiveDateTime, Offset, TimeDelta, TimeZone, Timelike, Utc,
};
use chrono_tz::Tz;

/// How many years [`Cron::next_after`] looks ahead before it gives up. Expressions that parse
/// fire at least every 8 years (a February 29 across a century that is not a leap year), so
/// this bound is never reached by them; it only keeps the search finite.
const SEARCH_YEARS: i32 = 400;

/// The most days each month can have, February counted with its leap day.
const MAX_DAYS_IN_MONTH: [u32; 12] = [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];

const MONTH_NAMES: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// A parsed 6-field cron expression: `second minute hour day-of-month month day-of-week`.
///
/// The syntax is described in the [crate documentation](crate#cron-expressions). Two values are
/// equal when they were parsed from the same text (leading and trailing whitespace aside).
///
/// # Example
///
/// ```
/// use chrono::{TimeZone, Utc};
/// use hexeract_cron::{Cron, Tz};
///
/// // At 09:30 on weekdays.
/// let cron = Cron::parse("0 30 9 * * MON-FRI")?;
/// // 2026-01-02 is a Friday; the next run after its 09:30 is on Monday 2026-01-05.
/// let after = Utc.with_ymd_and_hms(2026, 1, 2, 9, 30, 0).unwrap();
/// let next = cron.next_after(after, Tz::UTC);
/// assert_eq!(next, Some(Utc.with_ymd_and_hms(2026, 1, 5, 9, 30, 0).unwrap()));
/// assert_eq!(cron.to_string(), "0 30 9 * * MON-FRI");
/// # Ok::<(), hexeract_cron::CronError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cron {
    /// The expression as written, without leading and trailing whitespace.
    source: String,
    /// Bit `n` is set when second `n` (0-59) matches.
    seconds: u64,
    /// Bit `n` is set when minute `n` (0-59) matches.
    minutes: u64,
    /// Bit `n` is set when hour `n` (0-23) matches.
    hours: u64,
    /// Bit `n` is set when day `n` (1-31) of the month matches.
    days_of_month: u64,
    /// Bit `n` is set when month `n` (1-12) matches.
    months: u64,
    /// Bit `n` is set when weekday `n` (0-6, 0 is Sunday) matches; 7 is stored as 0.
    days_of_week: u64,
    /// Whether the day-of-month field was something else than `*`.
    day_of_month_restricted: bool,
    /// Whether the day-of-week field was something else than `*`.
    day_of_week_restricted: bool,
}

/// Why a cron expression was rejected.
///
/// Its [`Display`](fmt::Display) is one sentence that names the field, the part of it that is
/// wrong and what is allowed there, for example
/// `the hour field "25" is out of range: hours are 0-23`.
///
/// ```
/// use hexeract_cron::Cron;
///
/// let error = Cron::parse("*/5 * * * *").unwrap_err();
/// assert_eq!(
///     error.to_string(),
///     "expected 6 fields (second minute hour day-of-month month day-of-week), found 5: \
///      add a seconds field in front, e.g. \"0 */5 * * * *\""
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CronError {
    message: String,
}

impl CronError {
    fn new(message: String) -> CronError {
        CronError { message }
    }
}

impl fmt::Display for CronError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CronError {}

impl Cron {
    /// Parses a 6-field cron expression (see the [crate documentation](crate#cron-expressions)).
    ///
    /// Leading and trailing whitespace is ignored.
    ///
    /// # Errors
    ///
    /// A [`CronError`] naming the field and the part of it that is wrong when the expression
    /// does not have 6 fields, a value is out of range or not understood, a range is reversed,
    /// a step is not a number from 1 to the field's maximum, it uses an unsupported extension
    /// (`L`, `W`, `#`, `?`, `@daily`), or it can never fire (`0 0 0 30 2 *`).
    ///
    /// ```
    /// use hexeract_cron::Cron;
    ///
    /// assert!(Cron::parse("0 0 12 * * *").is_ok());
    /// let error = Cron::parse("0 0 0 30 2 *").unwrap_err();
    /// assert_eq!(
    ///     error.to_string(),
    ///     r#"the expression "0 0 0 30 2 *" never fires: February has no day 30"#
    /// );
    /// ```
    pub fn parse(expression: &str) -> Result<Cron, CronError> {
        let source = expression.trim();
        if source.is_empty() {
            return Err(CronError::new(format!(
                "the cron expression is empty: expected 6 fields ({FIELD_LIST}), \
                 e.g. \"0 */5 * * * *\" for every five minutes"
            )));
        }
        if source.starts_with('@') {
            return Err(macro_error(source));
        }
        let fields: Vec<&str> = source.split_whitespace().collect();
        if fields.len() != 6 {
            return Err(field_count_error(&fields));
        }

        let seconds = parse_field(Field::Second, fields[0])?;
        let minutes = parse_field(Field::Minute, fields[1])?;
        let hours = parse_field(Field::Hour, fields[2])?;
        let days_of_month = parse_field(Field::DayOfMonth, fields[3])?;
        let months = parse_field(Field::Month, fields[4])?;
        let days_of_week = parse_field(Field::DayOfWeek, fields[5])?;

        let cron = Cron {
            source: source.to_owned(),
            seconds,
            minutes,
            hours,
            days_of_month,
            months,
            days_of_week,
            day_of_month_restricted: fields[3] != "*",
            day_of_week_restricted: fields[5] != "*",
        };
        cron.check_can_fire()?;
        Ok(cron)
    }

    /// The first fire time strictly after `after`, evaluated in the time zone `tz`.
    ///
    /// The expression is matched against local times in `tz`; a local time that happens twice
    /// (clocks going back) fires at its earlier instant only, and a local time that does not
    /// happen (clocks going forward) fires at the first instant after the gap, once for all the
    /// matching local times in that gap. See the [crate documentation](crate#fire-times).
    ///
    /// Returns `None` only when no fire time exists in the next 400 years, or none before the
    /// end of the range that `chrono` can represent (about the year 262 000; also at its very
    /// start west of UTC, where local times are not representable). Expressions accepted by
    /// [`Cron::parse`] fire at least once every 8 years.
    ///
    /// ```
    /// use chrono::{TimeZone, Utc};
    /// use hexeract_cron::{Cron, Tz};
    ///
    /// let cron = Cron::parse("0 0 12 29 2 *")?;
    /// let after = Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap();
    /// assert_eq!(
    ///     cron.next_after(after, Tz::UTC),
    ///     Some(Utc.with_ymd_and_hms(2028, 2, 29, 12, 0, 0).unwrap())
    /// );
    /// # Ok::<(), hexeract_cron::CronError>(())
    /// ```
    #[must_use]
    pub fn next_after(&self, after: DateTime<Utc>, tz: Tz) -> Option<DateTime<Utc>> {
        // Local times up to the local time of `after` map to instants at or before `after`
        // (the mapping below never goes backwards), so the search starts one second later.
        let local_after = local_time(after, tz)?;
        let mut from = local_after
            .with_nanosecond(0)?
            .checked_add_signed(TimeDelta::seconds(1))?;
        loop {
            let local = self.next_local_match(from)?;
            let instant = first_instant_at_or_after(local, tz)?;
            if instant > after {
                return Some(instant);
            }
            // `local` happens twice and `after` is past its first occurrence: skip it.
            from = local.checked_add_signed(TimeDelta::seconds(1))?;
        }
    }

    /// The expression as written (without leading and trailing whitespace).
    ///
    /// ```
    /// use hexeract_cron::Cron;
    ///
    /// assert_eq!(Cron::parse(" 0 0 * * * * ")?.as_str(), "0 0 * * * *");
    /// # Ok::<(), hexeract_cron::CronError>(())
    /// ```
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether the expression matches a local time (to the second). Used by the tests to check
    /// the field-by-field search against a plain scan.
    #[cfg(test)]
    fn matches(&self, local: NaiveDateTime) -> bool {
        has_bit(self.seconds, local.second())
            && has_bit(self.minutes, local.minute())
            && has_bit(self.hours, local.hour())
            && has_bit(self.months, local.month())
            && self.day_matches(local.date())
    }

    /// Whether a date matches the day-of-month and day-of-week fields (not the month field).
    fn day_matches(&self, date: NaiveDate) -> bool {
        let day_of_month = has_bit(self.days_of_month, date.day());
        let day_of_week = has_bit(self.days_of_week, date.weekday().num_days_from_sunday());
        if self.day_of_month_restricted && self.day_of_week_restricted {
            day_of_month || day_of_week
        } else {
            // The unrestricted field has every bit set, so only the other one decides.
            day_of_month && day_of_week
        }
    }

    /// The first local time at or after `from` (a whole second) that matches, found field by
    /// field: month, day, hour, minute, second, carrying into the larger field when a smaller
    /// one has no matching value left.
    fn next_local_match(&self, from: NaiveDateTime) -> Option<NaiveDateTime> {
        let last_year = from.year().saturating_add(SEARCH_YEARS);
        let mut date = from.date();
        let (mut hour, mut minute, mut second) = (from.hour(), from.minute(), from.second());
        loop {
            if date.year() > last_year {
                return None;
            }
            if !has_bit(self.months, date.month()) {
                date = self.first_day_of_next_month(date)?;
                (hour, minute, second) = (0, 0, 0);
                continue;
            }
            if !self.day_matches(date) {
                date = date.succ_opt()?;
                (hour, minute, second) = (0, 0, 0);
                continue;
            }

            let Some(next_hour) = next_bit(self.hours, hour) else {
                date = date.succ_opt()?;
                (hour, minute, second) = (0, 0, 0);
                continue;
            };
            if next_hour != hour {
                (hour, minute, second) = (next_hour, 0, 0);
            }

            let Some(next_minute) = next_bit(self.minutes, minute) else {
                // No matching minute left in this hour: go to the start of the next hour.
                if hour == 23 {
                    date = date.succ_opt()?;
                    hour = 0;
                } else {
                    hour += 1;
                }
                (minute, second) = (0, 0);
                continue;
            };
            if next_minute != minute {
                (minute, second) = (next_minute, 0);
            }

            let Some(next_second) = next_bit(self.seconds, second) else {
                // No matching second left in this minute: go to the start of the next minute.
                if minute == 59 {
                    if hour == 23 {
                        date = date.succ_opt()?;
                        hour = 0;
                    } else {
                        hour += 1;
                    }
                    minute = 0;
                } else {
                    minute += 1;
                }
                second = 0;
                continue;
            };
            return date.and_hms_opt(hour, minute, next_second);
        }
    }

    /// The first day of the next selected month after the month of `date`.
    fn first_day_of_next_month(&self, date: NaiveDate) -> Option<NaiveDate> {
        match next_bit(self.months, date.month() + 1) {
            Some(month) => NaiveDate::from_ymd_opt(date.year(), month, 1),
            None => {
                let first_month = next_bit(self.months, 1)?;
                NaiveDate::from_ymd_opt(date.year().checked_add(1)?, first_month, 1)
            }
        }
    }

    /// Rejects expressions whose selected days of the month exist in none of the selected
    /// months. Only the day-of-month field decides when the day-of-week field is `*`; otherwise
    /// a day of the week (which every month has) can make the expression fire.
    fn check_can_fire(&self) -> Result<(), CronError> {
        if !self.day_of_month_restricted || self.day_of_week_restricted {
            return Ok(());
        }
        let months: Vec<u32> = (1..=12).filter(|&m| has_bit(self.months, m)).collect();
        let days: Vec<u32> = (1..=31)
            .filter(|&d| has_bit(self.days_of_month, d))
            .collect();
        let can_fire = months.iter().any(|&month| {
            let max_day = MAX_DAYS_IN_MONTH[month as usize - 1];
            days.iter().any(|&day| day <= max_day)
        });
        if can_fire {
            return Ok(());
        }
        let month_names: Vec<String> = months
            .iter()
            .map(|&m| MONTH_NAMES[m as usize - 1].to_owned())
            .collect();
        let day_numbers: Vec<String> = days.iter().map(u32::to_string).collect();
        let verb = if months.len() == 1 { "has" } else { "have" };
        Err(CronError::new(format!(
            "the expression \"{}\" never fires: {} {verb} no day {}",
            self.source,
            join_words(&month_names, "and"),
            join_words(&day_numbers, "or"),
        )))
    }
}

impl FromStr for Cron {
    type Err = CronError;

    /// Same as [`Cron::parse`].
    fn from_str(expression: &str) -> Result<Cron, CronError> {
        Cron::parse(expression)
    }
}

impl fmt::Display for Cron {
    /// Writes the expression as written (see [`Cron::as_str`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// The instant a matching local time fires at: the instant itself when it happens once, the
/// earlier one when it happens twice, and the end of the gap when it does not happen.
///
/// All three are "the first instant whose local time is at or after `local`", which is why the
/// mapping never goes backwards as `local` grows.
fn first_instant_at_or_after(local: NaiveDateTime, tz: Tz) -> Option<DateTime<Utc>> {
    match tz.from_local_datetime(&local) {
        LocalResult::Single(instant) => Some(instant.with_timezone(&Utc)),
        LocalResult::Ambiguous(first, second) => {
            Some(first.with_timezone(&Utc).min(second.with_timezone(&Utc)))
        }
        LocalResult::None => end_of_gap(local, tz),
    }
}

/// For a local time inside a gap (clocks going forward), the instant the gap ends: the first
/// instant whose local time is at or after `local`.
fn end_of_gap(local: NaiveDateTime, tz: Tz) -> Option<DateTime<Utc>> {
    // UTC offsets are less than 16 hours, so 18 hours before the local time read as UTC the
    // local clock is still before `local`, and 18 hours after it is past it.
    const MARGIN: i64 = 18 * 3600;
    let target = local.and_utc().timestamp();
    let mut before = target.checked_sub(MARGIN)?;
    let mut at_or_after = target.checked_add(MARGIN)?;
    while at_or_after - before > 1 {
        let middle = before + (at_or_after - before) / 2;
        if local_seconds(middle, tz)? >= target {
            at_or_after = middle;
        } else {
            before = middle;
        }
    }
    DateTime::from_timestamp(at_or_after, 0)
}

/// The local time in `tz` of a Unix timestamp, itself as seconds since 1970-01-01T00:00:00.
fn local_seconds(timestamp: i64, tz: Tz) -> Option<i64> {
    let instant = DateTime::from_timestamp(timestamp, 0)?;
    Some(local_time(instant, tz)?.and_utc().timestamp())
}

/// The local (wall-clock) time of an instant in `tz`; `None` at the ends of the range `chrono`
/// can represent, where the local time may not be representable.
fn local_time(instant: DateTime<Utc>, tz: Tz) -> Option<NaiveDateTime> {
    let offset = tz.offset_from_utc_datetime(&instant.naive_utc()).fix();
    instant.naive_utc().checked_add_offset(offset)
}

fn has_bit(bits: u64, value: u32) -> bool {
    value < 64 && bits & (1 << value) != 0
}

/// The smallest set bit at or above `from`.
fn next_bit(bits: u64, from: u32) -> Option<u32> {
    if from >= 64 {
        return None;
    }
    let remaining = bits & (u64::MAX << from);
    if remaining == 0 {
        None
    } else {
        Some(remaining.trailing_zeros())
    }
}

/// `a`, `a and b`, `a, b and c` (with `and` or `or`).
fn join_words(words: &[String], conjunction: &str) -> String {
    match words {
        [] => String::new(),
        [only] => only.clone(),
        [init @ .., last] => format!("{} {conjunction} {last}", init.join(", ")),
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------------

const FIELD_LIST: &str = "second minute hour day-of-month month day-of-week";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Second,
    Minute,
    Hour,
    DayOfMonth,
    Month,
    DayOfWeek,
}

impl Field {
    /// The name used in error messages.
    fn name(self) -> &'static str {
        match self {
            Field::Second => "second",
            Field::Minute => "minute",
            Field::Hour => "hour",
            Field::DayOfMonth => "day-of-month",
            Field::Month => "month",
            Field::DayOfWeek => "day-of-week",
        }
    }

    fn min(self) -> u32 {
        match self {
            Field::DayOfMonth | Field::Month => 1,
            Field::Second | Field::Minute | Field::Hour | Field::DayOfWeek => 0,
        }
    }

    fn max(self) -> u32 {
        match self {
            Field::Second | Field::Minute => 59,
            Field::Hour => 23,
            Field::DayOfMonth => 31,
            Field::Month => 12,
            Field::DayOfWeek => 7,
        }
    }

    /// What the field accepts, as the end of an error message.
    fn allowed(self) -> &'static str {
        match self {
            Field::Second => "seconds are 0-59",
            Field::Minute => "minutes are 0-59",
            Field::Hour => "hours are 0-23",
            Field::DayOfMonth => "days of the month are 1-31",
            Field::Month => "months are 1-12 or JAN-DEC",
            Field::DayOfWeek => "days of the week are 0-7 (0 and 7 are Sunday) or SUN-SAT",
        }
    }

    /// The value of a name (`JAN`, `mon`), in the month and day-of-week fields.
    fn value_of_name(self, name: &str) -> Option<u32> {
        const MONTHS: [&str; 12] = [
            "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
        ];
        const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
        let (names, first_value): (&[&str], u32) = match self {
            Field::Month => (&MONTHS, 1),
            Field::DayOfWeek => (&DAYS, 0),
            Field::Second | Field::Minute | Field::Hour | Field::DayOfMonth => return None,
        };
        let index = names.iter().position(|n| n.eq_ignore_ascii_case(name))?;
        Some(first_value + index as u32)
    }
}

/// Where an error is, for messages: the whole field when the offending part is all of it,
/// otherwise the part within the field.
fn subject(field: Field, text: &str, part: &str) -> String {
    if part == text {
        format!("the {} field \"{text}\"", field.name())
    } else {
        format!("\"{part}\" in the {} field \"{text}\"", field.name())
    }
}

fn macro_error(source: &str) -> CronError {
    let name = source.split_whitespace().next().unwrap_or(source);
    let equivalent = match name.to_ascii_lowercase().as_str() {
        "@yearly" | "@annually" => Some("0 0 0 1 1 *"),
        "@monthly" => Some("0 0 0 1 * *"),
        "@weekly" => Some("0 0 0 * * SUN"),
        "@daily" | "@midnight" => Some("0 0 0 * * *"),
        "@hourly" => Some("0 0 * * * *"),
        _ => None,
    };
    let message = match equivalent {
        Some(fields) => format!(
            "the macro \"{name}\" is not supported: write the 6 fields ({FIELD_LIST}) \
             instead, here \"{fields}\""
        ),
        None => format!(
            "the macro \"{name}\" is not supported: write the 6 fields ({FIELD_LIST}) \
             instead, e.g. \"0 0 0 * * *\" for every day at midnight"
        ),
    };
    CronError::new(message)
}

fn field_count_error(fields: &[&str]) -> CronError {
    let found = fields.len();
    let advice = match found {
        5 => format!(
            "add a seconds field in front, e.g. \"0 {}\"",
            fields.join(" ")
        ),
        7 => format!(
            "a year field is not supported, remove it, e.g. \"{}\"",
            fields[..6].join(" ")
        ),
        _ => "e.g. \"0 */5 * * * *\" fires every five minutes".to_owned(),
    };
    CronError::new(format!(
        "expected 6 fields ({FIELD_LIST}), found {found}: {advice}"
    ))
}

/// Parses one field into a bit set.
fn parse_field(field: Field, text: &str) -> Result<u64, CronError> {
    let mut bits = 0u64;
    for item in text.split(',') {
        if item.is_empty() {
            return Err(CronError::new(format!(
                "{} has an empty list item: separate values with single commas, e.g. \"1,15\"",
                subject(field, text, text)
            )));
        }
        bits |= parse_item(field, text, item)?;
    }
    if field == Field::DayOfWeek && has_bit(bits, 7) {
        // 7 is Sunday, like 0.
        bits = (bits & !(1 << 7)) | 1;
    }
    Ok(bits)
}

/// Parses one comma-separated item: `*`, `a`, `a-b`, each optionally followed by `/step`.
fn parse_item(field: Field, text: &str, item: &str) -> Result<u64, CronError> {
    let (base, step) = match item.split_once('/') {
        Some((base, step)) => (base, Some(parse_step(field, text, item, step)?)),
        None => (item, None),
    };

    let (start, end) = if base == "*" {
        (field.min(), field.max())
    } else if base.is_empty() {
        return Err(CronError::new(format!(
            "{} has no value before \"/\": start a step with \"*\" or a value, e.g. \"*/15\"",
            subject(field, text, item)
        )));
    } else if let Some((first, last)) = base.split_once('-') {
        if first.is_empty() || last.is_empty() || last.contains('-') {
            return Err(CronError::new(format!(
                "{} is not a valid range: write a range as two values joined by \"-\", e.g. \"1-5\"",
                subject(field, text, base)
            )));
        }
        let start = parse_value(field, text, first)?;
        let mut end = parse_value(field, text, last)?;
        if field == Field::DayOfWeek && start > 0 && last.eq_ignore_ascii_case("SUN") {
            // `FRI-SUN`: a range that ends with Sunday ends with 7.
            end = 7;
        }
        if start > end {
            return Err(CronError::new(format!(
                "{} is a reversed range: the start must not be greater than the end",
                subject(field, text, base)
            )));
        }
        (start, end)
    } else {
        let value = parse_value(field, text, base)?;
        match step {
            // `a/n` runs from `a` to the end of the field.
            Some(_) => (value, field.max()),
            None => (value, value),
        }
    };

    let step = step.unwrap_or(1);
    let mut bits = 0u64;
    let mut value = start;
    while value <= end {
        bits |= 1 << value;
        value += step;
    }
    Ok(bits)
}

/// Parses the step after `/`: a number from 1 to the field's maximum.
fn parse_step(field: Field, text: &str, item: &str, step: &str) -> Result<u32, CronError> {
    let max = field.max();
    let is_number = !step.is_empty() && step.bytes().all(|b| b.is_ascii_digit());
    match step.parse::<u32>() {
        Ok(value) if is_number && (1..=max).contains(&value) => Ok(value),
        _ if step.is_empty() => Err(CronError::new(format!(
            "{} has no step after \"/\": the step must be a number from 1 to {max}",
            subject(field, text, item)
        ))),
        _ => Err(CronError::new(format!(
            "{} has an invalid step \"{step}\": the step after \"/\" must be a number from 1 to {max}",
            subject(field, text, item)
        ))),
    }
}

/// Parses one value: a number within the field's range, or a name in the month and
/// day-of-week fields.
fn parse_value(field: Field, text: &str, token: &str) -> Result<u32, CronError> {
    if !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit()) {
        return match token.parse::<u32>() {
            Ok(value) if (field.min()..=field.max()).contains(&value) => Ok(value),
            _ => Err(CronError::new(format!(
                "{} is out of range: {}",
                subject(field, text, token),
                field.allowed()
            ))),
        };
    }
    if let Some(value) = field.value_of_name(token) {
        return Ok(value);
    }
    if let Some((symbol, meaning)) = unsupported_symbol(field, token) {
        let advice = if symbol == "?" {
            "write \"*\" instead"
        } else {
            "use \"*\", values, ranges like \"1-5\", steps like \"*/2\" or lists like \"1,15\""
        };
        return Err(CronError::new(format!(
            "{} uses \"{symbol}\" ({meaning}), which is not supported: {advice}",
            subject(field, text, token)
        )));
    }
    let what = match field {
        Field::Month => "a month",
        Field::DayOfWeek => "a day of the week",
        Field::Second | Field::Minute | Field::Hour | Field::DayOfMonth => "a number",
    };
    Err(CronError::new(format!(
        "{} is not {what}: {}",
        subject(field, text, token),
        field.allowed()
    )))
}

/// The Quartz and cronie extensions that a value may use: `#`, `?`, and `L` and `W` in the
/// day fields. (No month or weekday name contains an `L`, and `W` is only checked in the
/// day-of-month field, so `WED` is not mistaken for it.)
fn unsupported_symbol(field: Field, token: &str) -> Option<(&'static str, &'static str)> {
    let upper = token.to_ascii_uppercase();
    if upper.contains('#') {
        return Some(("#", "nth weekday of the month"));
    }
    if upper.contains('?') {
        return Some(("?", "no specific value"));
    }
    let day_field = field == Field::DayOfMonth || field == Field::DayOfWeek;
    if day_field && upper.contains('L') {
        return Some(("L", "last"));
    }
    if field == Field::DayOfMonth && upper.contains('W') {
        return Some(("W", "nearest weekday"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cron(expression: &str) -> Cron {
        Cron::parse(expression).unwrap()
    }

    fn values(bits: u64) -> Vec<u32> {
        (0..64).filter(|&v| has_bit(bits, v)).collect()
    }

    fn local(text: &str) -> NaiveDateTime {
        NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S").unwrap()
    }

    #[test]
    fn fields_become_bit_sets() {
        let c = cron("*/20 5,35 9-17/2 1-3,31 JAN-mar/2 mon-FRI");
        assert_eq!(values(c.seconds), vec![0, 20, 40]);
        assert_eq!(values(c.minutes), vec![5, 35]);
        assert_eq!(values(c.hours), vec![9, 11, 13, 15, 17]);
        assert_eq!(values(c.days_of_month), vec![1, 2, 3, 31]);
        assert_eq!(values(c.months), vec![1, 3]);
        assert_eq!(values(c.days_of_week), vec![1, 2, 3, 4, 5]);
        assert!(c.day_of_month_restricted);
        assert!(c.day_of_week_restricted);
    }

    #[test]
    fn stars_cover_the_whole_field() {
        let c = cron("* * * * * *");
        assert_eq!(values(c.seconds), (0..=59).collect::<Vec<_>>());
        assert_eq!(values(c.minutes), (0..=59).collect::<Vec<_>>());
        assert_eq!(values(c.hours), (0..=23).collect::<Vec<_>>());
        assert_eq!(values(c.days_of_month), (1..=31).collect::<Vec<_>>());
        assert_eq!(values(c.months), (1..=12).collect::<Vec<_>>());
        assert_eq!(values(c.days_of_week), (0..=6).collect::<Vec<_>>());
        assert!(!c.day_of_month_restricted);
        assert!(!c.day_of_week_restricted);
    }

    #[test]
    fn value_with_step_runs_to_the_end_of_the_field() {
        assert_eq!(values(cron("50/3 * * * * *").seconds), vec![50, 53, 56, 59]);
        assert_eq!(
            values(cron("0 0 0 25/3 * *").days_of_month),
            vec![25, 28, 31]
        );
        // 1/2 in the day-of-week field reaches 7, which is Sunday.
        assert_eq!(values(cron("0 0 0 * * 1/2").days_of_week), vec![0, 1, 3, 5]);
        assert_eq!(values(cron("0 0 0 * * */2").days_of_week), vec![0, 2, 4, 6]);
    }

    #[test]
    fn seven_and_sunday_in_the_day_of_week_field() {
        assert_eq!(values(cron("0 0 0 * * 7").days_of_week), vec![0]);
        assert_eq!(values(cron("0 0 0 * * 5-7").days_of_week), vec![0, 5, 6]);
        assert_eq!(
            values(cron("0 0 0 * * FRI-SUN").days_of_week),
            vec![0, 5, 6]
        );
        assert_eq!(values(cron("0 0 0 * * SAT-SUN").days_of_week), vec![0, 6]);
        assert_eq!(
            values(cron("0 0 0 * * SUN-SAT").days_of_week),
            (0..=6).collect::<Vec<_>>()
        );
        assert_eq!(values(cron("0 0 0 * * SUN-SUN").days_of_week), vec![0]);
        assert_eq!(
            values(cron("0 0 0 * * 0-7").days_of_week),
            (0..=6).collect::<Vec<_>>()
        );
    }

    #[test]
    fn only_a_literal_star_leaves_a_day_field_unrestricted() {
        let c = cron("0 0 0 */1 * *");
        assert!(c.day_of_month_restricted);
        assert!(!c.day_of_week_restricted);
        let c = cron("0 0 0 * * 0-7");
        assert!(!c.day_of_month_restricted);
        assert!(c.day_of_week_restricted);
    }

    #[test]
    fn leading_zeros_and_surrounding_whitespace() {
        let c = cron("\t05 07 09 01 02 * \n");
        assert_eq!(values(c.seconds), vec![5]);
        assert_eq!(values(c.days_of_month), vec![1]);
        assert_eq!(c.as_str(), "05 07 09 01 02 *");
    }

    #[test]
    fn day_rule_is_or_when_both_are_restricted() {
        // 2026-06-01 is a Monday, 2026-06-02 a Tuesday, 2026-06-15 a Monday.
        let both = cron("0 0 0 2 * MON");
        assert!(both.day_matches(NaiveDate::from_ymd_opt(2026, 6, 1).unwrap()));
        assert!(both.day_matches(NaiveDate::from_ymd_opt(2026, 6, 2).unwrap()));
        assert!(!both.day_matches(NaiveDate::from_ymd_opt(2026, 6, 3).unwrap()));
        let only_dow = cron("0 0 0 * * MON");
        assert!(only_dow.day_matches(NaiveDate::from_ymd_opt(2026, 6, 15).unwrap()));
        assert!(!only_dow.day_matches(NaiveDate::from_ymd_opt(2026, 6, 2).unwrap()));
        let only_dom = cron("0 0 0 2 * *");
        assert!(only_dom.day_matches(NaiveDate::from_ymd_opt(2026, 6, 2).unwrap()));
        assert!(!only_dom.day_matches(NaiveDate::from_ymd_opt(2026, 6, 1).unwrap()));
    }

    #[test]
    fn next_bit_and_has_bit() {
        assert_eq!(next_bit(0b1010, 0), Some(1));
        assert_eq!(next_bit(0b1010, 2), Some(3));
        assert_eq!(next_bit(0b1010, 4), None);
        assert_eq!(next_bit(u64::MAX, 63), Some(63));
        assert_eq!(next_bit(u64::MAX, 64), None);
        assert!(!has_bit(u64::MAX, 64));
    }

    #[test]
    fn join_words_reads_like_english() {
        let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(join_words(&words(&["a"]), "and"), "a");
        assert_eq!(join_words(&words(&["a", "b"]), "or"), "a or b");
        assert_eq!(join_words(&words(&["a", "b", "c"]), "and"), "a, b and c");
    }

    #[test]
    fn next_local_match_carries_into_larger_fields() {
        let c = cron("0 0 0 * * *");
        assert_eq!(
            c.next_local_match(local("2026-12-31 23:59:59")),
            Some(local("2027-01-01 00:00:00"))
        );
        let c = cron("59 59 23 31 12 *");
        assert_eq!(
            c.next_local_match(local("2026-12-31 23:59:59")),
            Some(local("2026-12-31 23:59:59"))
        );
        assert_eq!(
            c.next_local_match(local("2027-01-01 00:00:00")),
            Some(local("2027-12-31 23:59:59"))
        );
        let c = cron("30 * * * * *");
        assert_eq!(
            c.next_local_match(local("2026-02-28 23:59:31")),
            Some(local("2026-03-01 00:00:30"))
        );
        let c = cron("0 0 12 29 2 *");
        assert_eq!(
            c.next_local_match(local("2096-03-01 00:00:00")),
            Some(local("2104-02-29 12:00:00"))
        );
    }

    /// Every local second in a window, checked with `matches`, must agree with the field-by-field
    /// search.
    #[test]
    fn next_local_match_agrees_with_a_scan() {
        let expressions = [
            "*/7 * * * * *",
            "0 */13 * * * *",
            "30 15 */5 * * *",
            "0 0 0 * * *",
            "0 0 12 1-5,28 * TUE",
        ];
        for expression in expressions {
            let c = cron(expression);
            let start = local("2026-02-27 22:00:00");
            let mut expected = Vec::new();
            for offset in 0..3 * 86_400 {
                let t = start + TimeDelta::seconds(offset);
                if c.matches(t) {
                    expected.push(t);
                }
            }
            let mut found = Vec::new();
            let end = start + TimeDelta::seconds(3 * 86_400);
            let mut from = start;
            while let Some(t) = c.next_local_match(from) {
                if t >= end {
                    break;
                }
                found.push(t);
                from = t + TimeDelta::seconds(1);
            }
            assert_eq!(found, expected, "{expression}");
        }
    }

    #[test]
    fn day_fields_over_many_months_agree_with_a_scan() {
        let expressions = [
            "0 0 0 31 * *",
            "0 0 0 29 2 *",
            "0 0 0 13 * FRI",
            "0 0 0 1,15 * MON",
            "0 0 0 * 2 SUN",
            "0 0 0 */10 JAN,JUL *",
            "0 0 0 30 1-3 *",
        ];
        for expression in expressions {
            let c = cron(expression);
            let mut expected = Vec::new();
            let mut day = NaiveDate::from_ymd_opt(2095, 1, 1).unwrap();
            let end = NaiveDate::from_ymd_opt(2105, 1, 1).unwrap();
            while day < end {
                let t = day.and_hms_opt(0, 0, 0).unwrap();
                if c.matches(t) {
                    expected.push(t);
                }
                day = day.succ_opt().unwrap();
            }
            let mut found = Vec::new();
            let mut from = local("2095-01-01 00:00:00");
            while let Some(t) = c.next_local_match(from) {
                if t.date() >= end {
                    break;
                }
                found.push(t);
                from = t + TimeDelta::seconds(1);
            }
            assert_eq!(found, expected, "{expression}");
        }
    }

    /// A plain scan over every UTC second of a window: an instant fires when its local time
    /// reaches, for the first time, a local time that matches (the local times a jump forward
    /// skips are reached at the jump). `next_after` must give exactly these instants.
    #[test]
    fn next_after_agrees_with_a_scan_across_transitions() {
        let cases: [(&str, Tz, &str); 8] = [
            ("0 */15 2 * * *", Tz::Europe__Berlin, "2026-03-28 12:00:00"),
            ("0 */15 2 * * *", Tz::Europe__Berlin, "2026-10-24 12:00:00"),
            (
                "*/20 * 1-3 * * *",
                Tz::Europe__Berlin,
                "2026-10-24 12:00:00",
            ),
            (
                "*/20 * 1-3 * * *",
                Tz::Europe__Berlin,
                "2026-03-28 12:00:00",
            ),
            (
                "0 30 1,2 * * *",
                Tz::America__New_York,
                "2026-11-01 00:00:00",
            ),
            (
                "0 30 1,2 * * *",
                Tz::America__New_York,
                "2026-03-07 12:00:00",
            ),
            (
                "0 */10 1-2 * * *",
                Tz::Australia__Lord_Howe,
                "2026-04-04 00:00:00",
            ),
            (
                "0 */10 1-2 * * *",
                Tz::Australia__Lord_Howe,
                "2026-10-03 00:00:00",
            ),
        ];
        for (expression, tz, start) in cases {
            let c = cron(expression);
            let start = local(start).and_utc().timestamp();
            let end = start + 2 * 86_400;
            let mut highest_local = local_seconds(start, tz).unwrap();
            let mut expected = Vec::new();
            for instant in start + 1..=end {
                let local_now = local_seconds(instant, tz).unwrap();
                let newly_reached = highest_local + 1..=local_now;
                if newly_reached
                    .clone()
                    .any(|l| c.matches(DateTime::from_timestamp(l, 0).unwrap().naive_utc()))
                {
                    expected.push(DateTime::from_timestamp(instant, 0).unwrap());
                }
                highest_local = highest_local.max(local_now);
            }
            let mut found = Vec::new();
            let mut after = DateTime::from_timestamp(start, 0).unwrap();
            while let Some(next) = c.next_after(after, tz) {
                if next.timestamp() > end {
                    break;
                }
                found.push(next);
                after = next;
            }
            assert!(!expected.is_empty(), "{expression}");
            assert_eq!(found, expected, "{expression} in {tz}");
        }
    }

    #[test]
    fn the_ends_of_time_give_none_rather_than_a_panic() {
        let c = cron("* * * * * *");
        for tz in [
            Tz::UTC,
            Tz::Europe__Berlin,
            Tz::Pacific__Kiritimati,
            Tz::Etc__GMTPlus12,
        ] {
            assert_eq!(c.next_after(DateTime::<Utc>::MAX_UTC, tz), None);
            let near_the_end = DateTime::<Utc>::MAX_UTC - TimeDelta::days(2);
            assert!(c.next_after(near_the_end, tz).is_some());
            // West of UTC the local time of the first instant is not representable.
            let first = c.next_after(DateTime::<Utc>::MIN_UTC, tz);
            assert!(first.is_none_or(|t| t > DateTime::<Utc>::MIN_UTC));
        }
        let first = c.next_after(DateTime::<Utc>::MIN_UTC, Tz::UTC);
        assert_eq!(
            first,
            Some(DateTime::<Utc>::MIN_UTC + TimeDelta::seconds(1))
        );
        let leap_day = cron("0 0 0 29 2 *");
        let late = DateTime::<Utc>::MAX_UTC - TimeDelta::days(365);
        assert_eq!(leap_day.next_after(late, Tz::UTC), None);
    }

    #[test]
    fn end_of_gap_is_the_transition_instant() {
        let berlin = Tz::Europe__Berlin;
        let gap_end = end_of_gap(local("2026-03-29 02:30:00"), berlin).unwrap();
        assert_eq!(gap_end.to_rfc3339(), "2026-03-29T01:00:00+00:00");
        let lord_howe = Tz::Australia__Lord_Howe;
        let gap_end = end_of_gap(local("2026-10-04 02:15:00"), lord_howe).unwrap();
        assert_eq!(gap_end.to_rfc3339(), "2026-10-03T15:30:00+00:00");
    }
}
