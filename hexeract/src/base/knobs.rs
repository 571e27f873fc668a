//! Settings checked together: [`ConfigError`] (every invalid setting at once, named by its
//! variable or knob), the builders' [`KnobChecks`], and how settings files spell durations.

use std::fmt;

/// The prefix of Kafka's topics and groups when `KAFKA_TOPIC_PREFIX` is unset: the running
/// executable's name (`orders` for `target/release/orders`), in Kafka's topic characters.
pub(crate) fn executable_name() -> String {
    let name: String = std::env::current_exe()
        .ok()
        .and_then(|path| {
            path.file_stem()
                .map(|stem| stem.to_string_lossy().into_owned())
        })
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(200)
        .collect();
    if name.is_empty() {
        "hexeract".to_owned()
    } else {
        name
    }
}

/// One or more settings are invalid. Every problem is listed, not only the first.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// Each invalid setting.
    pub problems: Vec<ConfigProblem>,
}

/// One invalid setting: which, what it holds, and what it should hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigProblem {
    /// The environment variable or builder knob.
    pub setting: String,
    /// The value found (already redacted where it could hold a secret).
    pub value: String,
    /// What is accepted.
    pub expected: String,
}

/// Builder knobs checked together, so that one error lists every bad one.
#[derive(Default)]
pub(crate) struct KnobChecks(Vec<ConfigProblem>);

impl KnobChecks {
    fn require(mut self, ok: bool, knob: &str, value: String, expected: &str) -> KnobChecks {
        if !ok {
            self.0.push(ConfigProblem {
                setting: knob.to_owned(),
                value,
                expected: expected.to_owned(),
            });
        }
        self
    }

    /// A problem found by a check of the caller's own.
    #[cfg_attr(not(feature = "rabbitmq"), allow(dead_code))]
    pub(crate) fn problem(self, knob: &str, value: String, expected: &str) -> KnobChecks {
        self.require(false, knob, value, expected)
    }

    /// `value` must be 1 or more.
    pub(crate) fn at_least_one(self, knob: &str, value: u64) -> KnobChecks {
        self.require(value >= 1, knob, value.to_string(), "at least 1")
    }

    /// `value` must be longer than zero.
    pub(crate) fn not_zero(self, knob: &str, value: std::time::Duration) -> KnobChecks {
        self.require(
            !value.is_zero(),
            knob,
            format!("{value:?}"),
            "longer than zero",
        )
    }

    /// `value`, when set, must be longer than zero.
    pub(crate) fn not_zero_when_set(
        self,
        knob: &str,
        value: Option<std::time::Duration>,
    ) -> KnobChecks {
        match value {
            Some(value) => self.not_zero(knob, value),
            None => self,
        }
    }

    pub(crate) fn finish(self) -> Result<(), ConfigError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { problems: self.0 })
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid configuration, nothing was started:")?;
        for problem in &self.problems {
            write!(
                f,
                "\n  {} = {:?}: {}",
                problem.setting, problem.value, problem.expected
            )?;
        }
        Ok(())
    }
}

/// A duration as whole milliseconds, for serde (`#[serde(with = "millis")]`).
pub(crate) mod millis {
    use std::time::Duration;

    pub(crate) fn serialize<S: serde::Serializer>(
        value: &Duration,
        to: S,
    ) -> Result<S::Ok, S::Error> {
        to.serialize_u64(u64::try_from(value.as_millis()).unwrap_or(u64::MAX))
    }

    pub(crate) fn deserialize<'de, D: serde::Deserializer<'de>>(
        from: D,
    ) -> Result<Duration, D::Error> {
        <u64 as serde::Deserialize>::deserialize(from).map(Duration::from_millis)
    }
}

/// An optional duration as whole milliseconds, for serde.
pub(crate) mod millis_option {
    use std::time::Duration;

    pub(crate) fn serialize<S: serde::Serializer>(
        value: &Option<Duration>,
        to: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => super::millis::serialize(value, to),
            None => to.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: serde::Deserializer<'de>>(
        from: D,
    ) -> Result<Option<Duration>, D::Error> {
        <Option<u64> as serde::Deserialize>::deserialize(from)
            .map(|ms| ms.map(Duration::from_millis))
    }
}
