//! Every rejected input with its full error message, and the time zone errors.

use hexeract_cron::{parse_time_zone, Cron, CronError, TimeZoneError, Tz};

/// (expression, the whole message).
const REJECTED: &[(&str, &str)] = &[
    // ---- The number of fields, macros ------------------------------------------------------------
    (
        "",
        r#"the cron expression is empty: expected 6 fields (second minute hour day-of-month month day-of-week), e.g. "0 */5 * * * *" for every five minutes"#,
    ),
    (
        "   ",
        r#"the cron expression is empty: expected 6 fields (second minute hour day-of-month month day-of-week), e.g. "0 */5 * * * *" for every five minutes"#,
    ),
    (
        "*/5 * * * *",
        r#"expected 6 fields (second minute hour day-of-month month day-of-week), found 5: add a seconds field in front, e.g. "0 */5 * * * *""#,
    ),
    (
        "0 30 9 * * MON 2026",
        r#"expected 6 fields (second minute hour day-of-month month day-of-week), found 7: a year field is not supported, remove it, e.g. "0 30 9 * * MON""#,
    ),
    (
        "* *",
        r#"expected 6 fields (second minute hour day-of-month month day-of-week), found 2: e.g. "0 */5 * * * *" fires every five minutes"#,
    ),
    (
        "0 0 0 0 0 0 0 0",
        r#"expected 6 fields (second minute hour day-of-month month day-of-week), found 8: e.g. "0 */5 * * * *" fires every five minutes"#,
    ),
    (
        "@yearly",
        r#"the macro "@yearly" is not supported: write the 6 fields (second minute hour day-of-month month day-of-week) instead, here "0 0 0 1 1 *""#,
    ),
    (
        "@daily",
        r#"the macro "@daily" is not supported: write the 6 fields (second minute hour day-of-month month day-of-week) instead, here "0 0 0 * * *""#,
    ),
    (
        "@reboot",
        r#"the macro "@reboot" is not supported: write the 6 fields (second minute hour day-of-month month day-of-week) instead, e.g. "0 0 0 * * *" for every day at midnight"#,
    ),
    (
        "@every 5m",
        r#"the macro "@every" is not supported: write the 6 fields (second minute hour day-of-month month day-of-week) instead, e.g. "0 0 0 * * *" for every day at midnight"#,
    ),
    // ---- Out of range, per field -----------------------------------------------------------------
    (
        "60 * * * * *",
        r#"the second field "60" is out of range: seconds are 0-59"#,
    ),
    (
        "* 60 * * * *",
        r#"the minute field "60" is out of range: minutes are 0-59"#,
    ),
    (
        "0 0 25 * * *",
        r#"the hour field "25" is out of range: hours are 0-23"#,
    ),
    (
        "0 0 0 0 * *",
        r#"the day-of-month field "0" is out of range: days of the month are 1-31"#,
    ),
    (
        "0 0 0 32 * *",
        r#"the day-of-month field "32" is out of range: days of the month are 1-31"#,
    ),
    (
        "0 0 0 * 0 *",
        r#"the month field "0" is out of range: months are 1-12 or JAN-DEC"#,
    ),
    (
        "0 0 0 * 13 *",
        r#"the month field "13" is out of range: months are 1-12 or JAN-DEC"#,
    ),
    (
        "0 0 0 * * 8",
        r#"the day-of-week field "8" is out of range: days of the week are 0-7 (0 and 7 are Sunday) or SUN-SAT"#,
    ),
    (
        "0 0 1,25 * * *",
        r#""25" in the hour field "1,25" is out of range: hours are 0-23"#,
    ),
    (
        "0 0 1-25 * * *",
        r#""25" in the hour field "1-25" is out of range: hours are 0-23"#,
    ),
    (
        "99999999999 * * * * *",
        r#"the second field "99999999999" is out of range: seconds are 0-59"#,
    ),
    // ---- Steps -----------------------------------------------------------------------------------
    (
        "*/0 * * * * *",
        r#"the second field "*/0" has an invalid step "0": the step after "/" must be a number from 1 to 59"#,
    ),
    (
        "*/60 * * * * *",
        r#"the second field "*/60" has an invalid step "60": the step after "/" must be a number from 1 to 59"#,
    ),
    (
        "0 */x * * * *",
        r#"the minute field "*/x" has an invalid step "x": the step after "/" must be a number from 1 to 59"#,
    ),
    (
        "0 0 */ * * *",
        r#"the hour field "*/" has no step after "/": the step must be a number from 1 to 23"#,
    ),
    (
        "0 0 0 1/32 * *",
        r#"the day-of-month field "1/32" has an invalid step "32": the step after "/" must be a number from 1 to 31"#,
    ),
    (
        "0 0 0 * * 1-5/8",
        r#"the day-of-week field "1-5/8" has an invalid step "8": the step after "/" must be a number from 1 to 7"#,
    ),
    (
        "0 0 5/0 * * *",
        r#"the hour field "5/0" has an invalid step "0": the step after "/" must be a number from 1 to 23"#,
    ),
    (
        "0 0 */2/3 * * *",
        r#"the hour field "*/2/3" has an invalid step "2/3": the step after "/" must be a number from 1 to 23"#,
    ),
    (
        "0 0 /5 * * *",
        r#"the hour field "/5" has no value before "/": start a step with "*" or a value, e.g. "*/15""#,
    ),
    // ---- Reversed ranges and malformed items -----------------------------------------------------
    (
        "0 0 17-9 * * *",
        r#"the hour field "17-9" is a reversed range: the start must not be greater than the end"#,
    ),
    (
        "0 0 0 * * FRI-MON",
        r#"the day-of-week field "FRI-MON" is a reversed range: the start must not be greater than the end"#,
    ),
    (
        "0 0 0 * DEC-JAN *",
        r#"the month field "DEC-JAN" is a reversed range: the start must not be greater than the end"#,
    ),
    (
        "1,,2 * * * * *",
        r#"the second field "1,,2" has an empty list item: separate values with single commas, e.g. "1,15""#,
    ),
    (
        "1, * * * * *",
        r#"the second field "1," has an empty list item: separate values with single commas, e.g. "1,15""#,
    ),
    (
        ",1 * * * * *",
        r#"the second field ",1" has an empty list item: separate values with single commas, e.g. "1,15""#,
    ),
    (
        "0 0 1- * * *",
        r#"the hour field "1-" is not a valid range: write a range as two values joined by "-", e.g. "1-5""#,
    ),
    (
        "0 0 -1 * * *",
        r#"the hour field "-1" is not a valid range: write a range as two values joined by "-", e.g. "1-5""#,
    ),
    (
        "0 0 1-2-3 * * *",
        r#"the hour field "1-2-3" is not a valid range: write a range as two values joined by "-", e.g. "1-5""#,
    ),
    (
        "*5 * * * * *",
        r#"the second field "*5" is not a number: seconds are 0-59"#,
    ),
    // ---- Unknown names and values ----------------------------------------------------------------
    (
        "0 0 0 * FOO *",
        r#"the month field "FOO" is not a month: months are 1-12 or JAN-DEC"#,
    ),
    (
        "0 0 0 * * MONDAY",
        r#"the day-of-week field "MONDAY" is not a day of the week: days of the week are 0-7 (0 and 7 are Sunday) or SUN-SAT"#,
    ),
    (
        "0 0 x * * *",
        r#"the hour field "x" is not a number: hours are 0-23"#,
    ),
    (
        "0 0 MON * * *",
        r#"the hour field "MON" is not a number: hours are 0-23"#,
    ),
    (
        "0 0 0 * * 1-FOO",
        r#""FOO" in the day-of-week field "1-FOO" is not a day of the week: days of the week are 0-7 (0 and 7 are Sunday) or SUN-SAT"#,
    ),
    // ---- Unsupported extensions ------------------------------------------------------------------
    (
        "0 0 0 L * *",
        r#"the day-of-month field "L" uses "L" (last), which is not supported: use "*", values, ranges like "1-5", steps like "*/2" or lists like "1,15""#,
    ),
    (
        "0 0 0 LW * *",
        r#"the day-of-month field "LW" uses "L" (last), which is not supported: use "*", values, ranges like "1-5", steps like "*/2" or lists like "1,15""#,
    ),
    (
        "0 0 0 15W * *",
        r#"the day-of-month field "15W" uses "W" (nearest weekday), which is not supported: use "*", values, ranges like "1-5", steps like "*/2" or lists like "1,15""#,
    ),
    (
        "0 0 0 L-3 * *",
        r#""L" in the day-of-month field "L-3" uses "L" (last), which is not supported: use "*", values, ranges like "1-5", steps like "*/2" or lists like "1,15""#,
    ),
    (
        "0 0 0 * * 5L",
        r#"the day-of-week field "5L" uses "L" (last), which is not supported: use "*", values, ranges like "1-5", steps like "*/2" or lists like "1,15""#,
    ),
    (
        "0 0 0 * * 5#3",
        r##"the day-of-week field "5#3" uses "#" (nth weekday of the month), which is not supported: use "*", values, ranges like "1-5", steps like "*/2" or lists like "1,15""##,
    ),
    (
        "0 0 0 * * MON#1",
        r##"the day-of-week field "MON#1" uses "#" (nth weekday of the month), which is not supported: use "*", values, ranges like "1-5", steps like "*/2" or lists like "1,15""##,
    ),
    (
        "0 0 0 ? * MON",
        r#"the day-of-month field "?" uses "?" (no specific value), which is not supported: write "*" instead"#,
    ),
    (
        "0 0 0 * * ?",
        r#"the day-of-week field "?" uses "?" (no specific value), which is not supported: write "*" instead"#,
    ),
    // ---- Never fires -----------------------------------------------------------------------------
    (
        "0 0 0 30 2 *",
        r#"the expression "0 0 0 30 2 *" never fires: February has no day 30"#,
    ),
    (
        "0 0 0 31 4,6,9,11 *",
        r#"the expression "0 0 0 31 4,6,9,11 *" never fires: April, June, September and November have no day 31"#,
    ),
    (
        "0 0 0 30,31 2 *",
        r#"the expression "0 0 0 30,31 2 *" never fires: February has no day 30 or 31"#,
    ),
    (
        "0 0 0 30-31 FEB *",
        r#"the expression "0 0 0 30-31 FEB *" never fires: February has no day 30 or 31"#,
    ),
];

#[test]
fn rejected_expressions_and_their_messages() {
    let mut failures = Vec::new();
    for (expression, expected) in REJECTED {
        match Cron::parse(expression) {
            Ok(cron) => failures.push(format!("{expression:?} was accepted as {cron:?}")),
            Err(error) if error.to_string() != *expected => failures.push(format!(
                "{expression:?}:\n  expected {expected}\n  found    {error}"
            )),
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn from_str_gives_the_same_errors() {
    for (expression, expected) in REJECTED {
        let error = expression.parse::<Cron>().unwrap_err();
        assert_eq!(error.to_string(), *expected);
        assert_eq!(Err(error), Cron::parse(expression));
    }
}

#[test]
fn errors_are_std_errors() {
    let error: Box<dyn std::error::Error + Send + Sync> =
        Box::new(Cron::parse("0 0 25 * * *").unwrap_err());
    assert_eq!(
        error.to_string(),
        r#"the hour field "25" is out of range: hours are 0-23"#
    );
    let error: Box<dyn std::error::Error + Send + Sync> =
        Box::new(parse_time_zone("Nowhere/Special").unwrap_err());
    assert!(error.to_string().starts_with("unknown time zone"));
    fn is_clone_eq<T: Clone + PartialEq + std::fmt::Debug>() {}
    is_clone_eq::<CronError>();
    is_clone_eq::<TimeZoneError>();
}

/// Inputs close to the rejected ones that are valid.
#[test]
fn accepted_expressions() {
    let accepted = [
        "0 0 0 29 2 *",
        "0 0 0 30 1-2 *",
        "0 0 0 31 2,3 *",
        "0 0 0 30 2 MON",
        "0 0 0 31 4 */1",
        "59 59 23 31 12 7",
        "0-59 0-59 0-23 1-31 1-12 0-7",
        "*/59 */59 */23 */31 */12 */7",
        "0 0 0 * * WED",
        "0 0 0 * jul *",
        "0 0 0 * * sat-sun",
        "0 0 0 * * 0,7",
        "5/15 * * * * *",
        "0 0 12 * * mon-fri",
        "  0 0 12 * * *\n",
        "0\t0\t12\t*\t*\t*",
    ];
    for expression in accepted {
        let cron =
            Cron::parse(expression).unwrap_or_else(|e| panic!("{expression:?} was rejected: {e}"));
        assert_eq!(cron.as_str(), expression.trim());
        assert_eq!(cron.to_string(), expression.trim());
        assert_eq!(expression.parse::<Cron>(), Ok(cron));
    }
}

#[test]
fn time_zones() {
    assert_eq!(parse_time_zone("Europe/Berlin"), Ok(Tz::Europe__Berlin));
    assert_eq!(parse_time_zone("UTC"), Ok(Tz::UTC));
    assert_eq!(parse_time_zone("Asia/Kolkata"), Ok(Tz::Asia__Kolkata));
    assert_eq!(
        parse_time_zone("Australia/Lord_Howe"),
        Ok(Tz::Australia__Lord_Howe)
    );
    assert_eq!(parse_time_zone("Etc/GMT+1"), Ok(Tz::Etc__GMTPlus1));
}

#[test]
fn time_zone_errors() {
    let cases = [
        // The same name in other letter case.
        (
            "europe/berlin",
            r#"unknown time zone "europe/berlin": did you mean "Europe/Berlin"?"#,
        ),
        ("utc", r#"unknown time zone "utc": did you mean "UTC"?"#),
        (
            " Europe/Berlin",
            r#"unknown time zone " Europe/Berlin": did you mean "Europe/Berlin"?"#,
        ),
        // Only the city.
        (
            "Berlin",
            r#"unknown time zone "Berlin": did you mean "Europe/Berlin"?"#,
        ),
        (
            "new york",
            r#"unknown time zone "new york": did you mean "America/New_York"?"#,
        ),
        // Typing mistakes.
        (
            "Europe/Berln",
            r#"unknown time zone "Europe/Berln": did you mean "Europe/Berlin"?"#,
        ),
        (
            "America/New York",
            r#"unknown time zone "America/New York": did you mean "America/New_York"?"#,
        ),
        (
            "US/Pacfic",
            r#"unknown time zone "US/Pacfic": did you mean "US/Pacific"?"#,
        ),
        // Nothing close.
        (
            "Mars/Olympus",
            r#"unknown time zone "Mars/Olympus": use an IANA time zone name such as "Europe/Berlin" or "UTC""#,
        ),
        (
            "",
            r#"unknown time zone "": use an IANA time zone name such as "Europe/Berlin" or "UTC""#,
        ),
        (
            "PST",
            r#"unknown time zone "PST": use an IANA time zone name such as "Europe/Berlin" or "UTC""#,
        ),
        (
            "GMT+1",
            r#"unknown time zone "GMT+1": use an IANA time zone name such as "Europe/Berlin" or "UTC""#,
        ),
    ];
    for (name, expected) in cases {
        let error = parse_time_zone(name).unwrap_err();
        assert_eq!(error.to_string(), expected, "{name:?}");
    }
}
