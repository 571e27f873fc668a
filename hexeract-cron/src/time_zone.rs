//! Parsing IANA time zone names, with a suggestion when a name is misspelt.

use std::fmt;

use chrono_tz::{Tz, TZ_VARIANTS};

/// Why a time zone name was rejected: it is not a known IANA name.
///
/// Its [`Display`](fmt::Display) names the input and, when a valid name is close to it,
/// suggests that name: `unknown time zone "Europe/Berln": did you mean "Europe/Berlin"?`.
///
/// ```
/// use hexeract_cron::parse_time_zone;
///
/// let error = parse_time_zone("Mars/Olympus_Mons").unwrap_err();
/// assert_eq!(
///     error.to_string(),
///     r#"unknown time zone "Mars/Olympus_Mons": use an IANA time zone name such as "Europe/Berlin" or "UTC""#
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimeZoneError {
    name: String,
    suggestion: Option<&'static str>,
}

impl fmt::Display for TimeZoneError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.suggestion {
            Some(suggestion) => write!(
                f,
                "unknown time zone \"{}\": did you mean \"{suggestion}\"?",
                self.name
            ),
            None => write!(
                f,
                "unknown time zone \"{}\": use an IANA time zone name such as \"Europe/Berlin\" or \"UTC\"",
                self.name
            ),
        }
    }
}

impl std::error::Error for TimeZoneError {}

/// Parses an IANA time zone name such as `"Europe/Berlin"` or `"UTC"`.
///
/// Names are matched exactly, as the IANA database spells them. When the name is unknown, the
/// error suggests the closest valid name, if one is close: the same name in other letter case
/// (`"europe/berlin"`), then a zone whose last part is the name (`"Berlin"`), then a name a
/// few typing mistakes away (`"Europe/Berln"`; not for names under five characters, and
/// with the same digits and signs). Nothing is suggested when no name is close.
///
/// # Errors
///
/// A [`TimeZoneError`] when `name` is not a time zone name of the IANA database.
///
/// # Example
///
/// ```
/// use hexeract_cron::{parse_time_zone, Tz};
///
/// assert_eq!(parse_time_zone("Europe/Berlin"), Ok(Tz::Europe__Berlin));
/// assert_eq!(parse_time_zone("UTC"), Ok(Tz::UTC));
/// assert_eq!(
///     parse_time_zone("europe/berlin").unwrap_err().to_string(),
///     r#"unknown time zone "europe/berlin": did you mean "Europe/Berlin"?"#
/// );
/// ```
pub fn parse_time_zone(name: &str) -> Result<Tz, TimeZoneError> {
    name.parse::<Tz>().map_err(|_| TimeZoneError {
        name: name.to_owned(),
        suggestion: suggest(name),
    })
}

/// The valid name closest to an unknown one, if any is close enough.
fn suggest(name: &str) -> Option<&'static str> {
    let wanted = name.trim();
    if wanted.is_empty() {
        return None;
    }
    let names = || TZ_VARIANTS.iter().map(|tz| tz.name());

    // The same name in other letter case.
    if let Some(found) = names().find(|n| n.eq_ignore_ascii_case(wanted)) {
        return Some(found);
    }

    // Only the city: "Berlin" or "new york" for "Europe/Berlin" and "America/New_York". Not
    // the `Etc/` zones: "GMT+1" is not "Etc/GMT+1", which is UTC-1.
    let city = wanted.replace(' ', "_");
    let found = names()
        .filter(|n| !n.starts_with("Etc/"))
        .find(|n| last_part(n).eq_ignore_ascii_case(&city));
    if found.is_some() {
        return found;
    }

    // A few typing mistakes: one per five characters, at most three, and none for names
    // shorter than five characters (where "PST" would become "EST"). The digits and signs must
    // stay the same: "GMT+1" is not "GMT+0", and "Etc/GMT+13" is not "Etc/GMT-13".
    let wanted = wanted.to_lowercase();
    let allowed = (wanted.chars().count() / 5).min(3);
    let mut best: Option<(usize, &'static str)> = None;
    for candidate in names() {
        if digits_and_signs(candidate) != digits_and_signs(&wanted) {
            continue;
        }
        let distance = edit_distance(&wanted, &candidate.to_lowercase());
        if distance <= allowed && best.is_none_or(|(best_distance, _)| distance < best_distance) {
            best = Some((distance, candidate));
        }
    }
    best.map(|(_, found)| found)
}

/// The digits, `+` and `-` of a name, in order: `+13` for `Etc/GMT+13`.
fn digits_and_signs(name: &str) -> String {
    name.chars()
        .filter(|c| c.is_ascii_digit() || *c == '+' || *c == '-')
        .collect()
}

/// The part of a zone name after its last `/`: `New_York` for `America/New_York`.
fn last_part(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// The Levenshtein distance between two strings: the fewest characters to insert, delete or
/// replace to turn one into the other.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    // previous[j]: the distance between the first i-1 characters of a and the first j of b.
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for (i, a_char) in a.chars().enumerate() {
        current[0] = i + 1;
        for (j, &b_char) in b.iter().enumerate() {
            let replace = previous[j] + usize::from(a_char != b_char);
            let delete = previous[j + 1] + 1;
            let insert = current[j] + 1;
            current[j + 1] = replace.min(delete).min(insert);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_single_character_edits() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("abc", ""), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("europe/berln", "europe/berlin"), 1);
        assert_eq!(edit_distance("flaw", "lawn"), 2);
        assert_eq!(edit_distance("zürich", "zurich"), 1);
    }

    #[test]
    fn suggestions() {
        assert_eq!(suggest("europe/berlin"), Some("Europe/Berlin"));
        assert_eq!(suggest("utc"), Some("UTC"));
        assert_eq!(suggest(" Europe/Berlin "), Some("Europe/Berlin"));
        assert_eq!(suggest("Berlin"), Some("Europe/Berlin"));
        assert_eq!(suggest("new york"), Some("America/New_York"));
        assert_eq!(suggest("Europe/Berln"), Some("Europe/Berlin"));
        assert_eq!(suggest("America/New York"), Some("America/New_York"));
        assert_eq!(suggest("Asia/Kolkatta"), Some("Asia/Kolkata"));
        assert_eq!(suggest("Mars/Olympus_Mons"), None);
        assert_eq!(suggest("nowhere"), None);
        assert_eq!(suggest("GMT+1"), None);
        assert_eq!(suggest("Etc/GMT+13"), None);
        assert_eq!(suggest("PST"), None);
        assert_eq!(suggest("etc/gmt+1"), Some("Etc/GMT+1"));
        assert_eq!(suggest(""), None);
    }

    #[test]
    fn every_known_name_parses() {
        for tz in TZ_VARIANTS {
            assert_eq!(parse_time_zone(tz.name()), Ok(tz));
        }
    }
}
