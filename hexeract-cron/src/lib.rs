//! Schedule expressions for Hexeract: cron expressions, IANA time zones and fixed-period
//! (`every`) schedules.
//!
//! This crate is shared by the `#[scheduled]` attribute, which parses expressions at compile time
//! so that a bad one is a compile error with a readable message, and by the runtime's scheduler,
//! which computes the fire times. Both use the same functions, so what compiles is exactly what
//! runs.
//!
//! # Cron expressions
//!
//! An expression has exactly six fields separated by whitespace:
//!
//! | field        | values                                                  |
//! |--------------|---------------------------------------------------------|
//! | second       | 0-59                                                    |
//! | minute       | 0-59                                                    |
//! | hour         | 0-23                                                    |
//! | day-of-month | 1-31                                                    |
//! | month        | 1-12 or `JAN`-`DEC`                                     |
//! | day-of-week  | 0-7 (0 and 7 are Sunday) or `SUN`-`SAT`                 |
//!
//! Names are case-insensitive. Each field is a comma-separated list of:
//!
//! - `*`: every value of the field;
//! - a value: `5`, `MON`;
//! - a range `a-b` with `a <= b`: `9-17`, `MON-FRI` (in the day-of-week field a range may end
//!   with `SUN`, meaning 7, so `FRI-SUN` is Friday to Sunday);
//! - a step over all values `*/n`, over a range `a-b/n`, or from a value to the field's
//!   maximum `a/n`, with `n` from 1 to the field's maximum: `*/15`, `9-17/2`, `5/10`.
//!
//! **Day of month and day of week** combine as in Vixie cron: when both fields are restricted
//! (neither is exactly `*`), a day matches when *either* matches; when one of them is `*`, only
//! the other one counts. So `0 0 0 1 * MON` fires on the first of every month *and* on every
//! Monday, and `0 0 0 * * MON` fires on Mondays only.
//!
//! Expressions that can never fire, such as `0 0 0 30 2 *`, are rejected. Quartz and cronie
//! extensions (`L`, `W`, `#`, `?`), macros (`@daily`) and the 5-field and 7-field forms are not
//! supported and are rejected with a message that says so.
//!
//! ```
//! use hexeract_cron::Cron;
//!
//! // Every 10 seconds.
//! let every_ten_seconds: Cron = "*/10 * * * * *".parse()?;
//! // At 09:00, 11:00, 13:00, 15:00 and 17:00 on weekdays.
//! let office_hours = Cron::parse("0 0 9-17/2 * * MON-FRI")?;
//! // At midnight on the 1st and the 15th of January to March.
//! let quarterly = Cron::parse("0 0 0 1,15 JAN-MAR *")?;
//! assert_eq!(office_hours.as_str(), "0 0 9-17/2 * * MON-FRI");
//!
//! let error = Cron::parse("0 0 25 * * *").unwrap_err();
//! assert_eq!(error.to_string(), r#"the hour field "25" is out of range: hours are 0-23"#);
//! # let _ = (every_ten_seconds, quarterly);
//! # Ok::<(), hexeract_cron::CronError>(())
//! ```
//!
//! # Fire times
//!
//! [`Cron::next_after`] evaluates an expression in a time zone. Fire times are whole seconds.
//! The expression matches local (wall-clock) times, and each matching local time becomes one
//! instant:
//!
//! - a local time that happens once is that instant;
//! - a local time that happens twice, when the clocks go back, is the *earlier* instant only;
//! - a local time that does not happen, when the clocks go forward, is the first instant after
//!   the gap (the moment of the change). Several matching local times in one gap are one fire
//!   time.
//!
//! The fire times are a function of the expression and the time zone alone, so every replica of
//! a service computes the same ones, and `next_after(t)` is the first of them strictly after
//! `t`.
//!
//! ```
//! use chrono::{TimeZone, Utc};
//! use hexeract_cron::{parse_time_zone, Cron};
//!
//! let cron = Cron::parse("0 30 2 * * *")?;
//! let berlin = parse_time_zone("Europe/Berlin")?;
//! // On 2026-03-29 the clocks in Berlin jump from 02:00 to 03:00: 02:30 does not happen, and
//! // the job runs at 03:00 local time instead.
//! let next = cron.next_after(Utc.with_ymd_and_hms(2026, 3, 28, 12, 0, 0).unwrap(), berlin);
//! assert_eq!(next, Some(Utc.with_ymd_and_hms(2026, 3, 29, 1, 0, 0).unwrap()));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # `every` schedules
//!
//! [`every_next_after`] gives the fire times of a fixed period, counted from the Unix epoch so
//! that they do not depend on when a process started.
//!
//! ```
//! use std::time::Duration;
//! use chrono::{TimeZone, Utc};
//! use hexeract_cron::every_next_after;
//!
//! let after = Utc.with_ymd_and_hms(2026, 1, 1, 10, 7, 12).unwrap();
//! let next = every_next_after(Duration::from_secs(300), after);
//! assert_eq!(next, Utc.with_ymd_and_hms(2026, 1, 1, 10, 10, 0).unwrap());
//! ```

mod cron;
mod every;
mod time_zone;

pub use chrono_tz::Tz;
pub use cron::{Cron, CronError};
pub use every::every_next_after;
pub use time_zone::{parse_time_zone, TimeZoneError};
