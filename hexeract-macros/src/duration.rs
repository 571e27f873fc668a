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

/// Parses a duration into milliseconds. The error says what was expected.
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    let expected = "expected a number followed by a unit (ms, s, m or h), e.g. \"30s\", \"500ms\" or \"1m30s\"";
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("empty duration: {expected}"));
    }
    let mut total: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!("invalid duration \"{text}\": {expected}"));
        }
        let (number, after) = rest.split_at(digits);
        let unit_len = after.bytes().take_while(u8::is_ascii_alphabetic).count();
        let (unit, after) = after.split_at(unit_len);
        let scale = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "" => return Err(format!("duration \"{text}\" has no unit: {expected}")),
            other => {
                return Err(format!(
                    "unknown unit `{other}` in duration \"{text}\": {expected}"
                ))
            }
        };
        let value: u64 = number
            .parse()
            .map_err(|_| format!("duration \"{text}\" is too large"))?;
        total = value
            .checked_mul(scale)
            .and_then(|part| total.checked_add(part))
            .ok_or_else(|| format!("duration \"{text}\" is too large"))?;
        rest = after;
    }
    Ok(total)
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
}
