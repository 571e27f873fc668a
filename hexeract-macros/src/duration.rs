//! Compile-time parsing of human durations such as `"30s"`, `"500ms"`, `"2m"` or `"1h30m"`.

use crate::args::Args;
use crate::ctxt::Ctxt;

/// The `timeout = "…"` key of `#[handler]` and `#[scheduled]`, in milliseconds: a duration
/// longer than zero. Problems are reported in `cx`.
pub(crate) fn timeout_arg(args: &Args, cx: &mut Ctxt) -> Option<u64> {
    let lit = args.string("timeout", "\"30s\"", cx)?;
    match parse_millis(&lit.value()) {
        Ok(0) => {
            cx.error_spanned_by(
                &lit,
                "`timeout` must be longer than zero, e.g. `timeout = \"30s\"`",
            );
            None
        }
        Ok(millis) => Some(millis),
        Err(problem) => {
            cx.error_spanned_by(&lit, format!("`timeout`: {problem}"));
            None
        }
    }
}

/// Parses a duration into milliseconds. The error says what was expected and, for a duration
/// written in words (`"5 minutes"`) or with a fraction (`"1.5h"`), how to write it.
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    let expected = "a duration is a number followed by a unit (ms, s, m or h), without spaces, \
                    and parts chain: \"30s\", \"500ms\", \"1m30s\"";
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("empty duration: {expected}"));
    }
    match parse_strict(text) {
        Ok(millis) => Ok(millis),
        Err(Problem::TooLarge) => Err(format!("duration \"{text}\" is too large")),
        Err(problem) => match parse_lenient(text) {
            Some(millis) if millis > 0 => Err(format!(
                "write \"{}\", not \"{text}\": {expected}",
                format_millis(millis)
            )),
            _ => Err(match problem {
                Problem::NoUnit(number) => format!(
                    "duration \"{text}\" has no unit: add one, e.g. \"{number}s\" for seconds; {expected}"
                ),
                Problem::UnknownUnit(unit) => {
                    format!("unknown unit `{unit}` in duration \"{text}\": {expected}")
                }
                Problem::Fraction => format!(
                    "duration \"{text}\" has a fraction: write whole numbers of a smaller unit, \
                     e.g. \"1m30s\" or \"1500ms\"; {expected}"
                ),
                Problem::Invalid | Problem::TooLarge => {
                    format!("invalid duration \"{text}\": {expected}")
                }
            }),
        },
    }
}

enum Problem<'a> {
    Invalid,
    NoUnit(&'a str),
    UnknownUnit(&'a str),
    Fraction,
    TooLarge,
}

/// The accepted form: `<digits><unit>` parts, units `ms`, `s`, `m`, `h`.
fn parse_strict(text: &str) -> Result<u64, Problem<'_>> {
    let mut total: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(Problem::Invalid);
        }
        let (number, after) = rest.split_at(digits);
        let unit_len = after.bytes().take_while(u8::is_ascii_alphabetic).count();
        let (unit, after) = after.split_at(unit_len);
        let scale = match unit {
            "" if after.starts_with('.') => return Err(Problem::Fraction),
            "" => return Err(Problem::NoUnit(number)),
            unit => unit_scale(unit).ok_or(Problem::UnknownUnit(unit))?,
        };
        let value: u64 = number.parse().map_err(|_| Problem::TooLarge)?;
        total = value
            .checked_mul(scale)
            .and_then(|part| total.checked_add(part))
            .ok_or(Problem::TooLarge)?;
        rest = after;
    }
    Ok(total)
}

fn unit_scale(unit: &str) -> Option<u64> {
    match unit {
        "ms" => Some(1),
        "s" => Some(1_000),
        "m" => Some(60_000),
        "h" => Some(3_600_000),
        _ => None,
    }
}

/// What a person may have meant: spaces, unit words (`5 minutes`, `2 hrs`) and fractions
/// (`1.5h`), for the error to suggest the accepted form.
fn parse_lenient(text: &str) -> Option<u64> {
    let mut total = 0.0_f64;
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let number_len = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        let number: f64 = rest[..number_len].parse().ok()?;
        rest = rest[number_len..].trim_start();
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = rest[..unit_len].to_ascii_lowercase();
        rest = rest[unit_len..].trim_start_matches([' ', ',']);
        let rest_and = rest.strip_prefix("and ").unwrap_or(rest);
        rest = rest_and.trim_start();
        let scale = match unit.as_str() {
            "ms" | "msec" | "msecs" | "millis" | "millisecond" | "milliseconds" => 1.0,
            "s" | "sec" | "secs" | "second" | "seconds" => 1_000.0,
            "m" | "min" | "mins" | "minute" | "minutes" => 60_000.0,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3_600_000.0,
            _ => return None,
        };
        total += number * scale;
    }
    (total.fract() == 0.0 && total < 1e15).then_some(total as u64)
}

/// `millis` in the accepted form, largest units first: `5m`, `1h30m`, `1500ms`.
fn format_millis(millis: u64) -> String {
    if !millis.is_multiple_of(1_000) {
        return format!("{millis}ms");
    }
    let mut out = String::new();
    let mut left = millis / 1_000;
    for (unit, seconds) in [("h", 3_600), ("m", 60), ("s", 1)] {
        if left >= seconds {
            out.push_str(&format!("{}{unit}", left / seconds));
            left %= seconds;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::parse_millis;

    #[test]
    fn parses_each_unit_and_combinations() {
        assert_eq!(parse_millis("500ms"), Ok(500));
        assert_eq!(parse_millis("30s"), Ok(30_000));
        assert_eq!(parse_millis("2m"), Ok(120_000));
        assert_eq!(parse_millis("1h"), Ok(3_600_000));
        assert_eq!(parse_millis("1m30s"), Ok(90_000));
        assert_eq!(parse_millis(" 5s "), Ok(5_000));
    }

    #[test]
    fn rejects_what_is_not_a_duration() {
        for bad in [
            "",
            "30",
            "s",
            "30x",
            "thirty seconds",
            "1.5s",
            "-1s",
            "30 s",
        ] {
            assert!(parse_millis(bad).is_err(), "{bad:?} should be rejected");
        }
        assert!(parse_millis("99999999999999999999s").is_err());
    }

    #[test]
    fn suggests_the_accepted_form() {
        for (written, suggested) in [
            ("5 minutes", "write \"5m\""),
            ("30 s", "write \"30s\""),
            ("1.5h", "write \"1h30m\""),
            ("2 hours 15 mins", "write \"2h15m\""),
            ("1.5s", "write \"1500ms\""),
            ("5minutes", "write \"5m\""),
            ("90", "has no unit: add one, e.g. \"90s\""),
            ("30x", "unknown unit `x`"),
        ] {
            let error = parse_millis(written).unwrap_err();
            assert!(
                error.starts_with(suggested) || error.contains(suggested),
                "{written:?}: {error}"
            );
        }
    }
}
