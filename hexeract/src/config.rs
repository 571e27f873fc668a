//! Runtime settings read from the environment.
//!
//! Every variable is optional; one that is set but invalid stops startup, and all invalid
//! variables are reported together.

use std::num::NonZeroU32;
use std::time::Duration;

use crate::error::{ConfigError, ConfigProblem};

/// Settings taken from the environment; `None` where the variable is unset.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct EnvSettings {
    pub(crate) max_deliveries: Option<NonZeroU32>,
    pub(crate) retry_max_delay: Option<Duration>,
    pub(crate) handler_timeout: Option<Duration>,
    pub(crate) shutdown_grace: Option<Duration>,
}

/// Variables that select a backend this version does not have yet. Setting one and getting the
/// in-memory store instead would lose messages silently, so it is refused.
const NOT_YET_SUPPORTED: [(&str, &str); 3] = [
    ("DATABASE_URL", "a Postgres outbox"),
    ("AMQP_URL", "RabbitMQ"),
    ("KAFKA_BROKERS", "Kafka"),
];

impl EnvSettings {
    pub(crate) fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<EnvSettings, ConfigError> {
        let mut problems = Vec::new();
        let mut read = |name: &str, parse: fn(&str) -> Result<u64, String>| -> Option<u64> {
            let value = lookup(name)?;
            match parse(&value) {
                Ok(parsed) => Some(parsed),
                Err(expected) => {
                    problems.push(ConfigProblem {
                        setting: name.to_owned(),
                        value,
                        expected,
                    });
                    None
                }
            }
        };
        let settings = EnvSettings {
            max_deliveries: read("MAX_DELIVERIES", |v| whole_number(v, 1, 1_000))
                .and_then(|n| NonZeroU32::new(n as u32)),
            retry_max_delay: read("RETRY_MAX_DELAY_MS", |v| whole_number(v, 1, 86_400_000))
                .map(Duration::from_millis),
            handler_timeout: read("HANDLER_TIMEOUT_MS", |v| whole_number(v, 1, 86_400_000))
                .map(Duration::from_millis),
            shutdown_grace: read("SHUTDOWN_GRACE_MS", |v| whole_number(v, 0, 3_600_000))
                .map(Duration::from_millis),
        };
        for (name, backend) in NOT_YET_SUPPORTED {
            if lookup(name).is_some() {
                problems.push(ConfigProblem {
                    setting: name.to_owned(),
                    value: "(set)".to_owned(),
                    expected: format!(
                        "unset: this version of Hexeract runs handlers in-process only and does not have {backend} yet"
                    ),
                });
            }
        }
        if problems.is_empty() {
            Ok(settings)
        } else {
            Err(ConfigError { problems })
        }
    }
}

fn whole_number(value: &str, min: u64, max: u64) -> Result<u64, String> {
    let expected = || format!("a whole number from {min} to {max}");
    let number: u64 = value.trim().parse().map_err(|_| expected())?;
    if (min..=max).contains(&number) {
        Ok(number)
    } else {
        Err(expected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            vars.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn unset_variables_leave_defaults() {
        assert_eq!(
            EnvSettings::from_lookup(lookup(&[])),
            Ok(EnvSettings::default())
        );
    }

    #[test]
    fn valid_variables_are_read() {
        let settings = EnvSettings::from_lookup(lookup(&[
            ("MAX_DELIVERIES", "3"),
            ("RETRY_MAX_DELAY_MS", "2500"),
            ("SHUTDOWN_GRACE_MS", "0"),
        ]))
        .unwrap();
        assert_eq!(settings.max_deliveries, NonZeroU32::new(3));
        assert_eq!(settings.retry_max_delay, Some(Duration::from_millis(2500)));
        assert_eq!(settings.shutdown_grace, Some(Duration::ZERO));
    }

    #[test]
    fn every_invalid_variable_is_reported_at_once() {
        let error = EnvSettings::from_lookup(lookup(&[
            ("MAX_DELIVERIES", "0"),
            ("RETRY_MAX_DELAY_MS", "soon"),
            ("DATABASE_URL", "postgres://user:secret@db/app"),
        ]))
        .unwrap_err();
        let settings: Vec<_> = error.problems.iter().map(|p| p.setting.as_str()).collect();
        assert_eq!(
            settings,
            ["MAX_DELIVERIES", "RETRY_MAX_DELAY_MS", "DATABASE_URL"]
        );
        let text = error.to_string();
        assert!(
            text.contains("MAX_DELIVERIES = \"0\": a whole number from 1 to 1000"),
            "{text}"
        );
        assert!(
            !text.contains("secret"),
            "a URL's password reached the error: {text}"
        );
    }
}
