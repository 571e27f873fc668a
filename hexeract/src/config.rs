//! Settings read from the environment.
//!
//! Every variable is optional; one that is set but invalid stops startup, and all invalid
//! variables are reported together. Values that may hold a password are never repeated in full.

use std::fmt;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use crate::redact::redact_url;

/// Where `hexeract::run` and `hexeract::publish` keep messages.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Database {
    /// `DATABASE_URL`, a `postgres://` URL.
    Postgres(String),
    /// An SQLite file: `HEXERACT_SQLITE_PATH`, or `hexeract.db` in the working directory.
    Sqlite(PathBuf),
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Database::Postgres(url) => write!(f, "Postgres({})", redact_url(url)),
            Database::Sqlite(path) => write!(f, "Sqlite({})", path.display()),
        }
    }
}

/// The SQLite file used when neither `DATABASE_URL` nor `HEXERACT_SQLITE_PATH` is set.
pub(crate) const DEFAULT_SQLITE_PATH: &str = "hexeract.db";

/// Settings taken from the environment; `None` where the variable is unset.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct EnvSettings {
    pub(crate) database: Database,
    pub(crate) max_deliveries: Option<NonZeroU32>,
    pub(crate) retry_max_delay: Option<Duration>,
    pub(crate) handler_timeout: Option<Duration>,
    pub(crate) shutdown_grace: Option<Duration>,
    pub(crate) relay_batch_size: Option<u32>,
    pub(crate) relay_poll_interval: Option<Duration>,
    pub(crate) consumer_poll_interval: Option<Duration>,
    /// `DELIVERY_LEASE_MS`: how long the outbox worker's claim of a delivery lasts.
    pub(crate) delivery_lease: Option<Duration>,
    /// `MAX_PAYLOAD_BYTES`: larger payloads are dead-lettered (parked) without being decoded.
    pub(crate) max_payload_bytes: Option<usize>,
    /// `STORE_TIMEOUT_MS`: the deadline of the workers' own statements.
    pub(crate) store_timeout: Option<Duration>,
    /// The `SCHEDULER_*` variables.
    pub(crate) scheduler: SchedulerSettings,
    /// `WORKER_PORT`: the port of the health and metrics endpoints (8081; 0 picks a free one).
    pub(crate) worker_port: u16,
    /// `INBOX_RETENTION_DAYS` (7): inbox marks older than this are deleted; `None`: kept.
    pub(crate) inbox_retention: Option<Duration>,
    /// `DEAD_LETTER_RETENTION_DAYS` (30): dead letters older than this are deleted; `None`: kept.
    pub(crate) dead_letter_retention: Option<Duration>,
    /// `AMQP_URL`: deliver through RabbitMQ.
    pub(crate) amqp: Option<Amqp>,
    /// `KAFKA_BROKERS`: deliver through Kafka.
    pub(crate) kafka: Option<Kafka>,
}

/// `KAFKA_BROKERS` with `KAFKA_TOPIC_PREFIX` and `KAFKA_TOPIC_PARTITIONS`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Kafka {
    pub(crate) brokers: String,
    pub(crate) topic_prefix: String,
    /// `KAFKA_TOPIC_PARTITIONS`; `None` where unset (3).
    pub(crate) partitions: Option<u32>,
}

/// The scheduler's own variables; `None` where unset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SchedulerSettings {
    /// `SCHEDULER_POLL_INTERVAL_MS`
    pub(crate) poll_interval: Option<Duration>,
    /// `SCHEDULER_BATCH_SIZE`
    pub(crate) batch_size: Option<u32>,
    /// `SCHEDULER_MIN_CYCLE_DELAY_MS`
    pub(crate) min_cycle_delay: Option<Duration>,
    /// `SCHEDULER_DISPATCH_TIMEOUT_MS`
    pub(crate) dispatch_timeout: Option<Duration>,
    /// `SCHEDULER_LEASE_MS`
    pub(crate) lease: Option<Duration>,
}

/// `AMQP_URL` with `HEXERACT_EXCHANGE`, `HEXERACT_QUEUE_PREFIX` and `AMQP_PREFETCH`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Amqp {
    pub(crate) url: String,
    pub(crate) exchange: String,
    pub(crate) queue_prefix: String,
    /// `AMQP_PREFETCH`; `None` where unset.
    pub(crate) prefetch: Option<u32>,
}

impl std::fmt::Debug for Amqp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Amqp")
            .field("url", &redact_url(&self.url))
            .field("exchange", &self.exchange)
            .field("queue_prefix", &self.queue_prefix)
            .field("prefetch", &self.prefetch)
            .finish()
    }
}

impl Default for EnvSettings {
    fn default() -> EnvSettings {
        EnvSettings {
            database: Database::Sqlite(PathBuf::from(DEFAULT_SQLITE_PATH)),
            max_deliveries: None,
            retry_max_delay: None,
            handler_timeout: None,
            shutdown_grace: None,
            relay_batch_size: None,
            relay_poll_interval: None,
            consumer_poll_interval: None,
            delivery_lease: None,
            max_payload_bytes: None,
            store_timeout: None,
            scheduler: SchedulerSettings::default(),
            worker_port: DEFAULT_WORKER_PORT,
            inbox_retention: Some(days(DEFAULT_INBOX_RETENTION_DAYS)),
            dead_letter_retention: Some(days(DEFAULT_DEAD_LETTER_RETENTION_DAYS)),
            amqp: None,
            kafka: None,
        }
    }
}

/// Inbox marks are kept this many days unless `INBOX_RETENTION_DAYS` says otherwise.
pub(crate) const DEFAULT_INBOX_RETENTION_DAYS: u64 = 7;
/// Dead letters are kept this many days unless `DEAD_LETTER_RETENTION_DAYS` says otherwise.
pub(crate) const DEFAULT_DEAD_LETTER_RETENTION_DAYS: u64 = 30;

fn days(days: u64) -> Duration {
    Duration::from_secs(days * 86_400)
}

/// A retention in days; 0 keeps forever.
fn retention(days_set: Option<u64>, default: u64) -> Option<Duration> {
    match days_set.unwrap_or(default) {
        0 => None,
        n => Some(days(n)),
    }
}

/// The port of the health and metrics endpoints unless `WORKER_PORT` says otherwise.
pub(crate) const DEFAULT_WORKER_PORT: u16 = 8081;

impl EnvSettings {
    pub(crate) fn from_env() -> Result<EnvSettings, ConfigError> {
        EnvSettings::from_lookup(|name| std::env::var(name).ok())
    }

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
        let mut settings = EnvSettings {
            database: Database::Sqlite(PathBuf::from(DEFAULT_SQLITE_PATH)),
            max_deliveries: read("MAX_DELIVERIES", |v| whole_number(v, 1, 1_000))
                .and_then(|n| NonZeroU32::new(n as u32)),
            retry_max_delay: read("RETRY_MAX_DELAY_MS", |v| whole_number(v, 1, 86_400_000))
                .map(Duration::from_millis),
            handler_timeout: read("HANDLER_TIMEOUT_MS", |v| whole_number(v, 1, 86_400_000))
                .map(Duration::from_millis),
            shutdown_grace: read("SHUTDOWN_GRACE_MS", |v| whole_number(v, 0, 3_600_000))
                .map(Duration::from_millis),
            relay_batch_size: read("RELAY_BATCH_SIZE", |v| whole_number(v, 1, 10_000))
                .map(|n| n as u32),
            relay_poll_interval: read("RELAY_POLL_INTERVAL_MS", |v| whole_number(v, 1, 3_600_000))
                .map(Duration::from_millis),
            consumer_poll_interval: read("CONSUMER_POLL_INTERVAL_MS", |v| {
                whole_number(v, 1, 3_600_000)
            })
            .map(Duration::from_millis),
            delivery_lease: read("DELIVERY_LEASE_MS", |v| whole_number(v, 1, 86_400_000))
                .map(Duration::from_millis),
            max_payload_bytes: read("MAX_PAYLOAD_BYTES", |v| whole_number(v, 1, 1_073_741_824))
                .map(|n| n as usize),
            store_timeout: read("STORE_TIMEOUT_MS", |v| whole_number(v, 1, 3_600_000))
                .map(Duration::from_millis),
            scheduler: SchedulerSettings {
                poll_interval: read("SCHEDULER_POLL_INTERVAL_MS", |v| {
                    whole_number(v, 1, 3_600_000)
                })
                .map(Duration::from_millis),
                batch_size: read("SCHEDULER_BATCH_SIZE", |v| whole_number(v, 1, 10_000))
                    .map(|n| n as u32),
                min_cycle_delay: read("SCHEDULER_MIN_CYCLE_DELAY_MS", |v| {
                    whole_number(v, 0, 60_000)
                })
                .map(Duration::from_millis),
                dispatch_timeout: read("SCHEDULER_DISPATCH_TIMEOUT_MS", |v| {
                    whole_number(v, 1, 86_400_000)
                })
                .map(Duration::from_millis),
                lease: read("SCHEDULER_LEASE_MS", |v| whole_number(v, 1, 86_400_000))
                    .map(Duration::from_millis),
            },
            worker_port: read("WORKER_PORT", |v| whole_number(v, 0, 65_535))
                .map_or(DEFAULT_WORKER_PORT, |port| port as u16),
            inbox_retention: retention(
                read("INBOX_RETENTION_DAYS", |v| whole_number(v, 0, 36_500)),
                DEFAULT_INBOX_RETENTION_DAYS,
            ),
            dead_letter_retention: retention(
                read("DEAD_LETTER_RETENTION_DAYS", |v| whole_number(v, 0, 36_500)),
                DEFAULT_DEAD_LETTER_RETENTION_DAYS,
            ),
            amqp: None,
            kafka: None,
        };
        let partitions = match lookup("KAFKA_BROKERS") {
            Some(_) => {
                read("KAFKA_TOPIC_PARTITIONS", |v| whole_number(v, 1, 10_000)).map(|n| n as u32)
            }
            None => None,
        };
        // Like the names below, read only when there is a broker to apply it to.
        let prefetch = match lookup("AMQP_URL") {
            Some(_) => read("AMQP_PREFETCH", |v| whole_number(v, 1, 65_535)).map(|n| n as u32),
            None => None,
        };
        if let Some(url) = lookup("AMQP_URL") {
            let name = |variable: &str, default: &str| {
                lookup(variable).unwrap_or_else(|| default.to_owned())
            };
            let amqp = Amqp {
                exchange: name("HEXERACT_EXCHANGE", "hexeract"),
                queue_prefix: name("HEXERACT_QUEUE_PREFIX", "hexeract"),
                prefetch,
                url,
            };
            if !(amqp.url.starts_with("amqp://") || amqp.url.starts_with("amqps://")) {
                problems.push(ConfigProblem {
                    setting: "AMQP_URL".to_owned(),
                    value: redact_url(&amqp.url),
                    expected:
                        "an amqp:// or amqps:// URL (unset it to deliver through the database)"
                            .to_owned(),
                });
            }
            #[cfg(feature = "rabbitmq")]
            if let Err(error) = crate::rabbitmq::connection::tls_settings(&amqp.url) {
                problems.push(ConfigProblem {
                    setting: "AMQP_URL".to_owned(),
                    value: redact_url(&amqp.url),
                    expected: format!(
                        "an amqps:// URL whose cacertfile is a readable PEM file ({error})"
                    ),
                });
            }
            for (variable, value) in [
                ("HEXERACT_EXCHANGE", &amqp.exchange),
                ("HEXERACT_QUEUE_PREFIX", &amqp.queue_prefix),
            ] {
                if value.is_empty() || value.len() > 200 || value.starts_with("amq.") {
                    problems.push(ConfigProblem {
                        setting: variable.to_owned(),
                        value: value.clone(),
                        expected: "a name of 1 to 200 bytes, not starting with `amq.`".to_owned(),
                    });
                }
            }
            if lookup("KAFKA_BROKERS").is_some() {
                problems.push(ConfigProblem {
                    setting: "AMQP_URL".to_owned(),
                    value: redact_url(&amqp.url),
                    expected: "either AMQP_URL (RabbitMQ) or KAFKA_BROKERS (Kafka), not both"
                        .to_owned(),
                });
            }
            settings.amqp = Some(amqp);
        }
        match (lookup("DATABASE_URL"), lookup("HEXERACT_SQLITE_PATH")) {
            (Some(url), None) => {
                if url.starts_with("postgres://") || url.starts_with("postgresql://") {
                    settings.database = Database::Postgres(url);
                } else {
                    problems.push(ConfigProblem {
                        setting: "DATABASE_URL".to_owned(),
                        value: redact_url(&url),
                        expected: "a postgres:// URL (unset it to use SQLite)".to_owned(),
                    });
                }
            }
            (None, Some(path)) if !path.trim().is_empty() => {
                settings.database = Database::Sqlite(PathBuf::from(path));
            }
            (None, Some(path)) => problems.push(ConfigProblem {
                setting: "HEXERACT_SQLITE_PATH".to_owned(),
                value: path,
                expected: "a file path".to_owned(),
            }),
            (Some(url), Some(_)) => problems.push(ConfigProblem {
                setting: "DATABASE_URL".to_owned(),
                value: redact_url(&url),
                expected:
                    "either DATABASE_URL (PostgreSQL) or HEXERACT_SQLITE_PATH (SQLite), not both"
                        .to_owned(),
            }),
            (None, None) => {}
        }
        if let Some(brokers) = lookup("KAFKA_BROKERS") {
            if let Err(expected) = broker_list(&brokers) {
                problems.push(ConfigProblem {
                    setting: "KAFKA_BROKERS".to_owned(),
                    value: brokers.clone(),
                    expected,
                });
            }
            let topic_prefix = lookup("KAFKA_TOPIC_PREFIX").unwrap_or_default();
            if let Err(expected) = topic_prefix_ok(&topic_prefix) {
                problems.push(ConfigProblem {
                    setting: "KAFKA_TOPIC_PREFIX".to_owned(),
                    value: topic_prefix.clone(),
                    expected,
                });
            }
            settings.kafka = Some(Kafka {
                brokers,
                topic_prefix,
                partitions,
            });
        }
        if problems.is_empty() {
            Ok(settings)
        } else {
            Err(ConfigError { problems })
        }
    }
}

/// `host:port[,host:port…]`, as librdkafka's `bootstrap.servers` takes it.
fn broker_list(value: &str) -> Result<(), String> {
    let expected = "a list of brokers as host:port, separated by commas (localhost:9092 for a \
                    local broker; unset it to deliver without Kafka)";
    let ok = !value.trim().is_empty()
        && value.split(',').all(|broker| {
            let broker = broker.trim();
            let broker = broker
                .strip_prefix("PLAINTEXT://")
                .or_else(|| broker.strip_prefix("SSL://"))
                .or_else(|| broker.strip_prefix("SASL_SSL://"))
                .or_else(|| broker.strip_prefix("SASL_PLAINTEXT://"))
                .unwrap_or(broker);
            match broker.rsplit_once(':') {
                Some((host, port)) => {
                    !host.is_empty()
                        && !host.contains('/')
                        && port.parse::<u16>().is_ok_and(|port| port > 0)
                }
                None => false,
            }
        });
    if ok {
        Ok(())
    } else {
        Err(expected.to_owned())
    }
}

/// A prefix of topic and consumer group names: Kafka's topic characters, room left for the
/// aggregate.
fn topic_prefix_ok(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err(
            "set (required with KAFKA_BROKERS): the prefix of every topic and consumer \
                    group, usually the project's name"
                .to_owned(),
        );
    }
    if value.len() > 200
        || !value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        return Err(
            "1 to 200 characters among ASCII letters, digits, `.`, `_` and `-` (Kafka's topic \
             name characters)"
                .to_owned(),
        );
    }
    Ok(())
}

/// Sets a builder's knob only when its variable is set: an unset one keeps the builder's
/// default, so `hexeract::run` and the builder cannot disagree about it.
pub(crate) trait IfSet: Sized {
    fn if_set<T>(self, value: Option<T>, knob: impl FnOnce(Self, T) -> Self) -> Self {
        match value {
            Some(value) => knob(self, value),
            None => self,
        }
    }
}

impl<B> IfSet for B {}

fn whole_number(value: &str, min: u64, max: u64) -> Result<u64, String> {
    let expected = || format!("a whole number from {min} to {max}");
    let number: u64 = value.trim().parse().map_err(|_| expected())?;
    if (min..=max).contains(&number) {
        Ok(number)
    } else {
        Err(expected())
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
            ("RELAY_BATCH_SIZE", "250"),
            (
                "DATABASE_URL",
                "postgres://app:pw@db:5432/app?sslmode=require",
            ),
        ]))
        .unwrap();
        assert_eq!(settings.max_deliveries, NonZeroU32::new(3));
        assert_eq!(settings.retry_max_delay, Some(Duration::from_millis(2500)));
        assert_eq!(settings.shutdown_grace, Some(Duration::ZERO));
        assert_eq!(settings.relay_batch_size, Some(250));
        assert_eq!(
            settings.database,
            Database::Postgres("postgres://app:pw@db:5432/app?sslmode=require".into())
        );
        assert!(!format!("{:?}", settings.database).contains("pw"));
    }

    #[test]
    fn every_invalid_variable_is_reported_at_once_without_secrets() {
        let error = EnvSettings::from_lookup(lookup(&[
            ("MAX_DELIVERIES", "0"),
            ("RETRY_MAX_DELAY_MS", "soon"),
            ("DATABASE_URL", "mysql://user:secret@db/app"),
            ("AMQP_URL", "http://guest:secret@localhost"),
            ("HEXERACT_EXCHANGE", "amq.topic"),
        ]))
        .unwrap_err();
        let settings: Vec<_> = error.problems.iter().map(|p| p.setting.as_str()).collect();
        assert_eq!(
            settings,
            [
                "MAX_DELIVERIES",
                "RETRY_MAX_DELAY_MS",
                "AMQP_URL",
                "HEXERACT_EXCHANGE",
                "DATABASE_URL",
            ]
        );
        let text = error.to_string();
        assert!(
            text.contains("MAX_DELIVERIES = \"0\": a whole number from 1 to 1000"),
            "{text}"
        );
        assert!(text.contains("mysql://user:***@db/app"), "{text}");
        assert!(
            !text.contains("secret"),
            "a password reached the error: {text}"
        );
    }

    #[test]
    fn retention_defaults_to_7_and_30_days_and_0_keeps_forever() {
        let defaults = EnvSettings::from_lookup(lookup(&[])).unwrap();
        assert_eq!(
            defaults.inbox_retention,
            Some(Duration::from_secs(7 * 86_400))
        );
        assert_eq!(
            defaults.dead_letter_retention,
            Some(Duration::from_secs(30 * 86_400))
        );
        let set = EnvSettings::from_lookup(lookup(&[
            ("INBOX_RETENTION_DAYS", "0"),
            ("DEAD_LETTER_RETENTION_DAYS", "90"),
        ]))
        .unwrap();
        assert_eq!(set.inbox_retention, None, "0: kept forever");
        assert_eq!(
            set.dead_letter_retention,
            Some(Duration::from_secs(90 * 86_400))
        );
        let error = EnvSettings::from_lookup(lookup(&[("DEAD_LETTER_RETENTION_DAYS", "a month")]))
            .unwrap_err()
            .to_string();
        assert!(error.contains("DEAD_LETTER_RETENTION_DAYS"), "{error}");
    }

    #[test]
    fn worker_port_defaults_to_8081_and_a_bad_one_is_named() {
        assert_eq!(
            EnvSettings::from_lookup(lookup(&[])).unwrap().worker_port,
            8081
        );
        let settings = EnvSettings::from_lookup(lookup(&[("WORKER_PORT", "9100")])).unwrap();
        assert_eq!(settings.worker_port, 9100);
        for bad in [
            &[("WORKER_PORT", "65536")][..],
            &[("WORKER_PORT", "http")][..],
        ] {
            let error = EnvSettings::from_lookup(lookup(bad))
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("WORKER_PORT") && error.contains("from 0 to 65535"),
                "{error}"
            );
        }
    }

    #[cfg(feature = "rabbitmq")]
    #[test]
    fn an_unreadable_cacertfile_or_one_on_plain_amqp_stops_startup() {
        let cases: [&'static [(&str, &str)]; 2] = [
            &[(
                "AMQP_URL",
                "amqps://app:pw@broker/vh?cacertfile=/nonexistent/ca.pem",
            )],
            &[(
                "AMQP_URL",
                "amqp://app:pw@broker/vh?cacertfile=/etc/hostname",
            )],
        ];
        for vars in cases {
            let error = EnvSettings::from_lookup(lookup(vars))
                .unwrap_err()
                .to_string();
            assert!(error.contains("AMQP_URL"), "{error}");
            assert!(error.contains("cacertfile"), "{error}");
            assert!(!error.contains(":pw@"), "{error}");
        }
    }

    fn owned_lookup(vars: Vec<(&'static str, String)>) -> impl Fn(&str) -> Option<String> {
        move |name| {
            vars.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, v)| v.clone())
        }
    }

    /// The worker knobs added for `hexeract::run`, with their ranges.
    const WORKER_KNOBS: [(&str, u64, u64); 9] = [
        ("SCHEDULER_POLL_INTERVAL_MS", 1, 3_600_000),
        ("SCHEDULER_BATCH_SIZE", 1, 10_000),
        ("SCHEDULER_MIN_CYCLE_DELAY_MS", 0, 60_000),
        ("SCHEDULER_DISPATCH_TIMEOUT_MS", 1, 86_400_000),
        ("SCHEDULER_LEASE_MS", 1, 86_400_000),
        ("DELIVERY_LEASE_MS", 1, 86_400_000),
        ("AMQP_PREFETCH", 1, 65_535),
        ("MAX_PAYLOAD_BYTES", 1, 1_073_741_824),
        ("STORE_TIMEOUT_MS", 1, 3_600_000),
    ];

    #[test]
    fn worker_knobs_are_read_into_their_own_settings() {
        let settings = EnvSettings::from_lookup(lookup(&[
            ("SCHEDULER_POLL_INTERVAL_MS", "250"),
            ("SCHEDULER_BATCH_SIZE", "7"),
            ("SCHEDULER_MIN_CYCLE_DELAY_MS", "0"),
            ("SCHEDULER_DISPATCH_TIMEOUT_MS", "1234"),
            ("SCHEDULER_LEASE_MS", "4321"),
            ("DELIVERY_LEASE_MS", "60000"),
            ("AMQP_URL", "amqp://localhost"),
            ("AMQP_PREFETCH", "64"),
            ("MAX_PAYLOAD_BYTES", " 4096 "),
            ("STORE_TIMEOUT_MS", "2500"),
        ]))
        .unwrap();
        assert_eq!(
            settings.scheduler,
            SchedulerSettings {
                poll_interval: Some(Duration::from_millis(250)),
                batch_size: Some(7),
                min_cycle_delay: Some(Duration::ZERO),
                dispatch_timeout: Some(Duration::from_millis(1234)),
                lease: Some(Duration::from_millis(4321)),
            }
        );
        assert_eq!(settings.delivery_lease, Some(Duration::from_secs(60)));
        assert_eq!(settings.max_payload_bytes, Some(4096));
        assert_eq!(settings.store_timeout, Some(Duration::from_millis(2500)));
        assert_eq!(settings.amqp.unwrap().prefetch, Some(64));
        // Unset, each keeps the builder's default.
        let unset = EnvSettings::from_lookup(lookup(&[("AMQP_URL", "amqp://localhost")])).unwrap();
        assert_eq!(unset.scheduler, SchedulerSettings::default());
        assert_eq!(
            (
                unset.delivery_lease,
                unset.max_payload_bytes,
                unset.store_timeout
            ),
            (None, None, None)
        );
        assert_eq!(unset.amqp.unwrap().prefetch, None);
    }

    #[test]
    fn worker_knobs_take_their_bounds_and_refuse_one_past_them() {
        for (name, min, max) in WORKER_KNOBS {
            let with = |value: String| {
                let mut vars = vec![(name, value)];
                if name == "AMQP_PREFETCH" {
                    vars.push(("AMQP_URL", "amqp://localhost".to_owned()));
                }
                EnvSettings::from_lookup(owned_lookup(vars))
            };
            for fits in [min, max] {
                assert!(with(fits.to_string()).is_ok(), "{name} = {fits}");
            }
            let mut beyond = vec![(max + 1).to_string(), "soon".to_owned(), "-1".to_owned()];
            if min > 0 {
                beyond.push((min - 1).to_string());
            }
            for value in beyond {
                let error = with(value.clone()).unwrap_err();
                assert_eq!(error.problems.len(), 1, "{error}");
                let text = error.to_string();
                let expected = format!("{name} = \"{value}\": a whole number from {min} to {max}");
                assert!(text.contains(&expected), "{text}");
            }
        }
    }

    #[test]
    fn every_invalid_worker_knob_is_reported_at_once() {
        let error = EnvSettings::from_lookup(lookup(&[
            ("SCHEDULER_POLL_INTERVAL_MS", "0"),
            ("SCHEDULER_BATCH_SIZE", "10001"),
            ("SCHEDULER_MIN_CYCLE_DELAY_MS", "5ms"),
            ("SCHEDULER_DISPATCH_TIMEOUT_MS", "86400001"),
            ("SCHEDULER_LEASE_MS", "0"),
            ("DELIVERY_LEASE_MS", "30s"),
            ("AMQP_URL", "amqp://guest:secret@localhost"),
            ("AMQP_PREFETCH", "65536"),
            ("MAX_PAYLOAD_BYTES", "1073741825"),
            ("MAX_DELIVERIES", "0"),
        ]))
        .unwrap_err();
        let mut settings: Vec<_> = error.problems.iter().map(|p| p.setting.as_str()).collect();
        settings.sort_unstable();
        assert_eq!(
            settings,
            [
                "AMQP_PREFETCH",
                "DELIVERY_LEASE_MS",
                "MAX_DELIVERIES",
                "MAX_PAYLOAD_BYTES",
                "SCHEDULER_BATCH_SIZE",
                "SCHEDULER_DISPATCH_TIMEOUT_MS",
                "SCHEDULER_LEASE_MS",
                "SCHEDULER_MIN_CYCLE_DELAY_MS",
                "SCHEDULER_POLL_INTERVAL_MS",
            ]
        );
        let text = error.to_string();
        assert!(
            text.contains("SCHEDULER_MIN_CYCLE_DELAY_MS = \"5ms\": a whole number from 0 to 60000"),
            "{text}"
        );
        assert!(
            text.contains(
                "MAX_PAYLOAD_BYTES = \"1073741825\": a whole number from 1 to 1073741824"
            ),
            "{text}"
        );
    }

    #[test]
    fn amqp_prefetch_is_read_only_with_amqp_url() {
        // Like HEXERACT_EXCHANGE: without a broker it is ignored, even when invalid.
        let settings = EnvSettings::from_lookup(lookup(&[("AMQP_PREFETCH", "0")])).unwrap();
        assert_eq!(settings.amqp, None);
        let error = EnvSettings::from_lookup(lookup(&[
            ("AMQP_URL", "amqp://localhost"),
            ("AMQP_PREFETCH", "0"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("AMQP_PREFETCH = \"0\": a whole number from 1 to 65535"),
            "{error}"
        );
    }

    #[test]
    fn amqp_url_selects_the_broker_with_default_names() {
        let settings =
            EnvSettings::from_lookup(lookup(&[("AMQP_URL", "amqps://app:pw@broker/vh")])).unwrap();
        let amqp = settings.amqp.unwrap();
        assert_eq!(amqp.url, "amqps://app:pw@broker/vh");
        assert_eq!(
            (amqp.exchange.as_str(), amqp.queue_prefix.as_str()),
            ("hexeract", "hexeract")
        );
        assert!(!format!("{amqp:?}").contains("pw"));
        let both = EnvSettings::from_lookup(lookup(&[
            ("AMQP_URL", "amqp://localhost"),
            ("KAFKA_BROKERS", "localhost:9092"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(both.contains("not both"), "{both}");
    }

    #[test]
    fn kafka_brokers_need_a_topic_prefix_and_valid_names() {
        let settings = EnvSettings::from_lookup(lookup(&[
            ("KAFKA_BROKERS", "localhost:9092, kafka-2:9093"),
            ("KAFKA_TOPIC_PREFIX", "shop"),
            ("KAFKA_TOPIC_PARTITIONS", "6"),
        ]))
        .unwrap();
        assert_eq!(
            settings.kafka,
            Some(Kafka {
                brokers: "localhost:9092, kafka-2:9093".to_owned(),
                topic_prefix: "shop".to_owned(),
                partitions: Some(6),
            })
        );
        let error = EnvSettings::from_lookup(lookup(&[
            ("KAFKA_BROKERS", "http://localhost"),
            ("KAFKA_TOPIC_PARTITIONS", "0"),
        ]))
        .unwrap_err();
        let text = error.to_string();
        assert_eq!(error.problems.len(), 3, "{text}");
        assert!(
            text.contains("KAFKA_BROKERS = \"http://localhost\": a list of brokers as host:port"),
            "{text}"
        );
        assert!(
            text.contains("KAFKA_TOPIC_PREFIX = \"\": set (required with KAFKA_BROKERS)"),
            "{text}"
        );
        assert!(
            text.contains("KAFKA_TOPIC_PARTITIONS = \"0\": a whole number from 1 to 10000"),
            "{text}"
        );
        let bad_prefix = EnvSettings::from_lookup(lookup(&[
            ("KAFKA_BROKERS", "localhost:9092"),
            ("KAFKA_TOPIC_PREFIX", "my shop"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(
            bad_prefix.contains("Kafka's topic name characters"),
            "{bad_prefix}"
        );
        // Without brokers, the other Kafka variables are not read.
        let unused = EnvSettings::from_lookup(lookup(&[("KAFKA_TOPIC_PARTITIONS", "0")])).unwrap();
        assert_eq!(unused.kafka, None);
    }
}
