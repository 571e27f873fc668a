//! The runtime's error types, one per boundary.

use std::fmt;

use crate::registry::RegistryError;

/// Why [`hexeract::run`](crate::run) or [`Runtime::run`](crate::Runtime::run) stopped or could
/// not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is invalid; nothing was started.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The handlers cannot be registered together; nothing was started.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// Another runtime is already running on this store. A runtime fans messages out to the
    /// handlers it knows, so two runtimes with different handlers on one store would each
    /// deliver only part of the messages.
    #[error(
        "another runtime is already running on this store: run one runtime per store, or give \
         each runtime a store of its own"
    )]
    StoreBusy,
    /// The outbox store failed (it could not be opened, migrated or read).
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The configuration asks for something this build cannot do.
    #[error("{0}")]
    Unsupported(String),
    /// The broker failed (it could not be reached, or refused a publish).
    #[cfg(feature = "rabbitmq")]
    #[error(transparent)]
    Broker(#[from] crate::rabbitmq::BusError),
    /// Kafka failed (a client could not be created, a topic could not be created), or a
    /// handler cannot be used with it.
    #[cfg(feature = "kafka")]
    #[error(transparent)]
    Kafka(#[from] crate::kafka::KafkaError),
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
