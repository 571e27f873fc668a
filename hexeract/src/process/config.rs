//! Settings read from the environment.
//!
//! Every variable is optional; one that is set but invalid stops startup, and all invalid
//! variables are reported together. Values that may hold a password are never repeated in full.

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use crate::knobs::executable_name;
use crate::knobs::{millis, millis_option};
pub use crate::knobs::{ConfigError, ConfigProblem};
use crate::policy::Policy;
use crate::redact::redact_url;
use crate::worker::{MessageSource, WorkerBuilder};

/// Where [`hexeract::run`](crate::run), [`App`](crate::App) and
/// [`hexeract::publish`](crate::publish) keep messages.
///
/// In a configuration file: `{ "postgres": "postgres://…" }` or `{ "sqlite": "hexeract.db" }`.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Database {
    /// `DATABASE_URL`, a `postgres://` URL.
    Postgres(String),
    /// An SQLite file: `HEXERACT_SQLITE_PATH`, or `hexeract.db` in the working directory.
    Sqlite(PathBuf),
}

impl Default for Database {
    fn default() -> Database {
        Database::Sqlite(PathBuf::from(DEFAULT_SQLITE_PATH))
    }
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

/// The settings of a worker process: every variable of `docs/configuration.md` is one of its
/// fields, the knobs around handler calls in the engine's [`Policy`].
///
/// Read it from the environment ([`AppConfig::from_env`]), build it in code (it starts from
/// the process's defaults: [`AppConfig::default`]), or load it from a file with serde (every
/// key optional, durations in milliseconds, retentions in days):
///
/// ```
/// use std::time::Duration;
/// use hexeract::config::{Database, AppConfig};
///
/// let config: AppConfig = serde_json::from_str(r#"{
///     "database": { "postgres": "postgres://app@db/shop" },
///     "worker_port": 9100,
///     "policy": { "handler_timeout_ms": 5000, "retry": { "max_deliveries": 3 } },
///     "amqp": { "url": "amqps://app:secret@rabbit:5671/%2f" }
/// }"#)?;
/// assert_eq!(config.database, Database::Postgres("postgres://app@db/shop".into()));
/// assert_eq!(config.policy.handler_timeout, Duration::from_secs(5));
/// assert_eq!(config.amqp.as_ref().unwrap().exchange, "hexeract");
/// config.check()?;
///
/// let mut in_code = AppConfig::default();
/// in_code.policy.shutdown_grace = Duration::from_secs(20);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// | variable | field |
/// | --- | --- |
/// | `DATABASE_URL`, `HEXERACT_SQLITE_PATH` | `database` |
/// | `MAX_DELIVERIES` | `policy.retry` (`max_deliveries`) |
/// | `RETRY_MAX_DELAY_MS` | `policy.retry` (`max_delay_ms`) |
/// | `HANDLER_TIMEOUT_MS` | `policy.handler_timeout` |
/// | `SHUTDOWN_GRACE_MS` | `policy.shutdown_grace` |
/// | `MAX_PAYLOAD_BYTES` | `policy.max_payload_bytes` |
/// | `STORE_TIMEOUT_MS` | `policy.store_timeout` |
/// | `RELAY_BATCH_SIZE` | `policy.batch_size` |
/// | `CONSUMER_POLL_INTERVAL_MS` | `policy.poll_interval` |
/// | `DELIVERY_LEASE_MS` | `policy.lease` |
/// | `AMQP_PREFETCH` | `policy.prefetch` |
/// | `RELAY_POLL_INTERVAL_MS` | `relay_poll_interval` |
/// | `SCHEDULER_*` | `scheduler` |
/// | `WORKER_PORT`, `WORKER_ADDR` | `worker_port`, `worker_addr` |
/// | `INBOX_RETENTION_DAYS`, `DEAD_LETTER_RETENTION_DAYS` | `inbox_retention`, `dead_letter_retention` |
/// | `AMQP_URL`, `HEXERACT_EXCHANGE`, `HEXERACT_QUEUE_PREFIX`, `AMQP_MAX_MESSAGE_SIZE`, `AMQP_ALLOW_UNROUTED` | `amqp` |
/// | `KAFKA_BROKERS`, `KAFKA_TOPIC_PREFIX`, `KAFKA_TOPIC_PARTITIONS`, `KAFKA_REPLICATION_FACTOR` | `kafka` |
/// | `KAFKA_SECURITY_PROTOCOL`, `KAFKA_SASL_*`, `KAFKA_SSL_CA_LOCATION` | `kafka.security` |
/// | `HEXERACT_ALLOW_INSECURE_CONNECTIONS` | `allow_insecure_connections` |
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AppConfig {
    /// Where messages are kept.
    pub database: Database,
    /// The knobs around handler calls and the workers' loops (the process's preset, with the
    /// variables that are set).
    pub policy: Policy,
    /// `RELAY_POLL_INTERVAL_MS`: the broker relays' sleep after a pass that found nothing.
    #[serde(rename = "relay_poll_interval_ms", with = "millis")]
    pub relay_poll_interval: Duration,
    /// The `SCHEDULER_*` variables.
    pub scheduler: SchedulerConfig,
    /// `WORKER_PORT`: the port of the health and metrics endpoints (8081; 0 picks a free one).
    pub worker_port: u16,
    /// `WORKER_ADDR`: the address they listen on (`0.0.0.0`, every interface; `127.0.0.1` keeps
    /// them on the machine).
    pub worker_addr: std::net::IpAddr,
    /// `INBOX_RETENTION_DAYS` (7): inbox marks older than this are deleted; `None`: kept.
    #[serde(rename = "inbox_retention_days", with = "days")]
    pub inbox_retention: Option<Duration>,
    /// `DEAD_LETTER_RETENTION_DAYS` (30): dead letters older than this are deleted; `None`: kept.
    #[serde(rename = "dead_letter_retention_days", with = "days")]
    pub dead_letter_retention: Option<Duration>,
    /// `AMQP_URL`: deliver through RabbitMQ.
    pub amqp: Option<Amqp>,
    /// `KAFKA_BROKERS`: deliver through Kafka.
    pub kafka: Option<Kafka>,
    /// `HEXERACT_ALLOW_INSECURE_CONNECTIONS` (`false`): accept a database or broker on another
    /// machine reached without verified TLS (PostgreSQL's `sslmode` other than `verify-full` or
    /// `verify-ca`, `amqp://` rather than `amqps://`), with a warning at startup. Unset, such a
    /// URL stops startup: the network between may read or redirect everything, passwords
    /// included.
    pub allow_insecure_connections: bool,
}

/// `KAFKA_BROKERS` with `KAFKA_TOPIC_PREFIX`, `KAFKA_TOPIC_PARTITIONS` and
/// `KAFKA_REPLICATION_FACTOR`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kafka {
    /// `host:port[,host:port…]`.
    pub brokers: String,
    /// The prefix of every topic and consumer group.
    pub topic_prefix: String,
    /// `KAFKA_TOPIC_PARTITIONS`; `None` where unset (3).
    #[serde(default)]
    pub partitions: Option<u32>,
    /// `KAFKA_REPLICATION_FACTOR`: replicas of the topics created; `None` where unset (3).
    #[serde(default)]
    pub replication_factor: Option<u32>,
    /// `KAFKA_SECURITY_PROTOCOL` and the SASL and TLS settings beside it.
    #[serde(default)]
    pub security: KafkaSecurity,
}

/// How Kafka clients reach the brokers: `KAFKA_SECURITY_PROTOCOL`, `KAFKA_SASL_MECHANISM`,
/// `KAFKA_SASL_USERNAME`, `KAFKA_SASL_PASSWORD`, `KAFKA_SSL_CA_LOCATION`; `None` where unset.
/// Unset, the protocol is `plaintext` to brokers on this machine and `ssl` (verified) to any
/// other. TLS and SASL PLAIN or SCRAM need the `kafka-tls` feature, GSSAPI `kafka-gssapi`.
#[derive(Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaSecurity {
    /// `plaintext`, `ssl`, `sasl_plaintext` or `sasl_ssl` (librdkafka's `security.protocol`).
    pub protocol: Option<String>,
    /// `PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512` or `GSSAPI` (`sasl.mechanism`).
    pub sasl_mechanism: Option<String>,
    /// `sasl.username`.
    pub sasl_username: Option<String>,
    /// `sasl.password`; never shown by `Debug`.
    pub sasl_password: Option<String>,
    /// A PEM file of the certificate authorities to trust (`ssl.ca.location`), for brokers
    /// whose certificates a private authority issued.
    pub ssl_ca_location: Option<String>,
}

impl std::fmt::Debug for KafkaSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSecurity")
            .field("protocol", &self.protocol)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("sasl_username", &self.sasl_username)
            .field("sasl_password", &self.sasl_password.as_ref().map(|_| "***"))
            .field("ssl_ca_location", &self.ssl_ca_location)
            .finish()
    }
}

impl KafkaSecurity {
    /// The librdkafka options these settings make for `brokers`: `security.protocol` always
    /// (see [`KafkaSecurity`]), the others where set.
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub(crate) fn client_options(&self, brokers: &str) -> Vec<(&'static str, String)> {
        let (protocol, _) = crate::secure::kafka(brokers, self.protocol.as_deref());
        let mut options = vec![("security.protocol", protocol)];
        for (key, value) in [
            ("sasl.mechanism", &self.sasl_mechanism),
            ("sasl.username", &self.sasl_username),
            ("sasl.password", &self.sasl_password),
            ("ssl.ca.location", &self.ssl_ca_location),
        ] {
            if let Some(value) = value {
                options.push((key, value.clone()));
            }
        }
        options
    }

    /// What is wrong with these settings for `brokers`, each with the variable to change.
    fn problems(&self, brokers: &str) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        let problem = |setting: &str, value: &str, expected: String| ConfigProblem {
            setting: setting.to_owned(),
            value: value.to_owned(),
            expected,
        };
        let protocol = self.protocol.as_deref().map(str::to_ascii_lowercase);
        if let Some(given) = &protocol {
            if !["plaintext", "ssl", "sasl_plaintext", "sasl_ssl"].contains(&given.as_str()) {
                problems.push(problem(
                    "KAFKA_SECURITY_PROTOCOL",
                    given,
                    "plaintext, ssl, sasl_plaintext or sasl_ssl".to_owned(),
                ));
                return problems;
            }
        }
        let (effective, _) = crate::secure::kafka(brokers, protocol.as_deref());
        if effective.ends_with("ssl") && !cfg!(feature = "kafka-tls") {
            problems.push(problem(
                "KAFKA_SECURITY_PROTOCOL",
                &effective,
                format!(
                    "a protocol this build has: TLS needs hexeract's `kafka-tls` feature \
                     (librdkafka with OpenSSL){}",
                    if protocol.is_none() {
                        "; it is the default because a broker is on another machine (set \
                         plaintext and HEXERACT_ALLOW_INSECURE_CONNECTIONS=1 only on a trusted \
                         network)"
                    } else {
                        ""
                    }
                ),
            ));
        }
        let sasl = effective.starts_with("sasl");
        match (&self.sasl_mechanism, sasl) {
            (Some(mechanism), false) => problems.push(problem(
                "KAFKA_SASL_MECHANISM",
                mechanism,
                format!("no mechanism with security protocol {effective}: set KAFKA_SECURITY_PROTOCOL to sasl_ssl"),
            )),
            (None, true) => problems.push(problem(
                "KAFKA_SASL_MECHANISM",
                "",
                "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or GSSAPI, with a sasl_* protocol".to_owned(),
            )),
            (Some(mechanism), true) => match mechanism.as_str() {
                "PLAIN" | "SCRAM-SHA-256" | "SCRAM-SHA-512" => {
                    if mechanism.starts_with("SCRAM") && !cfg!(feature = "kafka-tls") {
                        problems.push(problem(
                            "KAFKA_SASL_MECHANISM",
                            mechanism,
                            "a mechanism this build has: SCRAM needs hexeract's `kafka-tls` \
                             feature (librdkafka with OpenSSL)"
                                .to_owned(),
                        ));
                    }
                    if self.sasl_username.is_none() || self.sasl_password.is_none() {
                        problems.push(problem(
                            "KAFKA_SASL_USERNAME",
                            self.sasl_username.as_deref().unwrap_or(""),
                            format!(
                                "a user name and a password (KAFKA_SASL_USERNAME and \
                                 KAFKA_SASL_PASSWORD) for {mechanism}"
                            ),
                        ));
                    }
                }
                "GSSAPI" if !cfg!(feature = "kafka-gssapi") => problems.push(problem(
                    "KAFKA_SASL_MECHANISM",
                    mechanism,
                    "a mechanism this build has: GSSAPI needs hexeract's `kafka-gssapi` feature \
                     (librdkafka with Cyrus SASL)"
                        .to_owned(),
                )),
                "GSSAPI" => {}
                _ => problems.push(problem(
                    "KAFKA_SASL_MECHANISM",
                    mechanism,
                    "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or GSSAPI".to_owned(),
                )),
            },
            (None, false) => {}
        }
        problems
    }
}

/// The scheduler's own variables; `None` where unset (the scheduler's defaults).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerConfig {
    /// `SCHEDULER_POLL_INTERVAL_MS`
    #[serde(rename = "poll_interval_ms", with = "millis_option")]
    pub poll_interval: Option<Duration>,
    /// `SCHEDULER_BATCH_SIZE`
    pub batch_size: Option<u32>,
    /// `SCHEDULER_MIN_CYCLE_DELAY_MS`
    #[serde(rename = "min_cycle_delay_ms", with = "millis_option")]
    pub min_cycle_delay: Option<Duration>,
    /// `SCHEDULER_DISPATCH_TIMEOUT_MS`
    #[serde(rename = "dispatch_timeout_ms", with = "millis_option")]
    pub dispatch_timeout: Option<Duration>,
    /// `SCHEDULER_LEASE_MS`
    #[serde(rename = "lease_ms", with = "millis_option")]
    pub lease: Option<Duration>,
}

/// `AMQP_URL` with `HEXERACT_EXCHANGE` and `HEXERACT_QUEUE_PREFIX`.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Amqp {
    /// `amqp://` or `amqps://`.
    pub url: String,
    /// `HEXERACT_EXCHANGE` (`hexeract`).
    #[serde(default = "default_name")]
    pub exchange: String,
    /// `HEXERACT_QUEUE_PREFIX` (`hexeract`).
    #[serde(default = "default_name")]
    pub queue_prefix: String,
    /// `AMQP_MAX_MESSAGE_SIZE`: the largest payload the broker takes, in bytes (128 MiB,
    /// RabbitMQ's own default `max_message_size`). The relay dead-letters a larger outbox row
    /// as `payload_too_large` instead of publishing it.
    #[serde(default = "default_max_message_size")]
    pub max_message_size: usize,
    /// `AMQP_ALLOW_UNROUTED`: message types (comma-separated; `*` for all) that may reach no
    /// queue. The relay dead-letters any other message the broker has no queue for as
    /// `unroutable`.
    #[serde(default)]
    pub allow_unrouted: Vec<String>,
}

fn default_name() -> String {
    "hexeract".to_owned()
}

fn default_max_message_size() -> usize {
    128 * 1024 * 1024
}

impl Amqp {
    /// `url` with the default exchange, queue prefix and message size, no type allowed to be
    /// unroutable.
    pub fn new(url: impl Into<String>) -> Amqp {
        Amqp {
            url: url.into(),
            exchange: default_name(),
            queue_prefix: default_name(),
            max_message_size: default_max_message_size(),
            allow_unrouted: Vec::new(),
        }
    }
}

impl std::fmt::Debug for Amqp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Amqp")
            .field("url", &redact_url(&self.url))
            .field("exchange", &self.exchange)
            .field("queue_prefix", &self.queue_prefix)
            .field("max_message_size", &self.max_message_size)
            .field("allow_unrouted", &self.allow_unrouted)
            .finish()
    }
}

impl Default for AppConfig {
    /// The process's defaults, as with no variable set: SQLite in `hexeract.db`,
    /// [`Policy::process`], port 8081, inbox marks kept 7 days and dead letters 30.
    fn default() -> AppConfig {
        AppConfig {
            database: Database::default(),
            policy: Policy::process(),
            relay_poll_interval: Policy::process().poll_interval,
            scheduler: SchedulerConfig::default(),
            worker_port: DEFAULT_WORKER_PORT,
            worker_addr: DEFAULT_WORKER_ADDR,
            inbox_retention: Some(days(DEFAULT_INBOX_RETENTION_DAYS)),
            dead_letter_retention: Some(days(DEFAULT_DEAD_LETTER_RETENTION_DAYS)),
            amqp: None,
            kafka: None,
            allow_insecure_connections: false,
        }
    }
}

/// Inbox marks are kept this many days unless `INBOX_RETENTION_DAYS` says otherwise.
pub(crate) const DEFAULT_INBOX_RETENTION_DAYS: u64 = 7;
/// Dead letters are kept this many days unless `DEAD_LETTER_RETENTION_DAYS` says otherwise.
pub(crate) const DEFAULT_DEAD_LETTER_RETENTION_DAYS: u64 = 30;

fn days(days: u64) -> Duration {
    Duration::from_secs(days.saturating_mul(86_400))
}

/// A retention in days; 0 keeps forever.
fn retention(days_set: Option<u64>, default: u64) -> Option<Duration> {
    match days_set.unwrap_or(default) {
        0 => None,
        n => Some(days(n)),
    }
}

/// RabbitMQ's own default, for `HEXERACT_TRANSPORT=rabbitmq` without `AMQP_URL`.
pub(crate) const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@localhost:5672/%2f";

/// Kafka's own default, for `HEXERACT_TRANSPORT=kafka` without `KAFKA_BROKERS`.
pub(crate) const DEFAULT_KAFKA_BROKERS: &str = "localhost:9092";

/// The port of the health and metrics endpoints unless `WORKER_PORT` says otherwise.
pub(crate) const DEFAULT_WORKER_PORT: u16 = 8081;

/// Where the health and metrics endpoints listen unless `WORKER_ADDR` says otherwise: every
/// interface.
pub(crate) const DEFAULT_WORKER_ADDR: std::net::IpAddr =
    std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);

/// Configuring any world's builder from the environment: the shared knobs of its [`Policy`].
impl<S: MessageSource> WorkerBuilder<S> {
    /// Applies `MAX_DELIVERIES`, `RETRY_MAX_DELAY_MS`, `HANDLER_TIMEOUT_MS`,
    /// `SHUTDOWN_GRACE_MS`, `MAX_PAYLOAD_BYTES` and `STORE_TIMEOUT_MS` from the environment
    /// where set; an invalid one is an error naming it. A builder reads no variable unless
    /// asked to by this.
    ///
    /// ```
    /// use hexeract::MemoryWorker;
    ///
    /// let runtime = MemoryWorker::builder().configure_from_env()?.build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn configure_from_env(self) -> Result<WorkerBuilder<S>, ConfigError> {
        self.configure_from(|name| std::env::var(name).ok())
    }

    /// Like [`configure_from_env`](WorkerBuilder::configure_from_env), reading variables
    /// through `lookup`.
    pub fn configure_from(
        mut self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<WorkerBuilder<S>, ConfigError> {
        let settings = AppConfig::from_lookup(&lookup)?;
        self.policy.take_set_variables(&settings.policy, lookup);
        Ok(self)
    }
}

impl AppConfig {
    /// The settings of the environment's variables (`docs/configuration.md`); every invalid
    /// one is reported at once.
    pub fn from_env() -> Result<AppConfig, ConfigError> {
        AppConfig::from_lookup(|name| std::env::var(name).ok())
    }

    /// Like [`from_env`](AppConfig::from_env), reading the variables through `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<AppConfig, ConfigError> {
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
        let ms = |n: u64| Duration::from_millis(n);
        let mut policy = Policy::process();
        if let Some(max) = read("MAX_DELIVERIES", |v| whole_number(v, 1, 1_000))
            .and_then(|n| NonZeroU32::new(n as u32))
        {
            policy.retry = policy.retry.max_deliveries(max);
        }
        if let Some(delay) = read("RETRY_MAX_DELAY_MS", |v| whole_number(v, 1, 86_400_000)) {
            policy.retry = policy.retry.max_delay(ms(delay));
        }
        if let Some(timeout) = read("HANDLER_TIMEOUT_MS", |v| whole_number(v, 1, 86_400_000)) {
            policy.handler_timeout = ms(timeout);
        }
        if let Some(grace) = read("SHUTDOWN_GRACE_MS", |v| whole_number(v, 0, 3_600_000)) {
            policy.shutdown_grace = ms(grace);
        }
        if let Some(batch) = read("RELAY_BATCH_SIZE", |v| whole_number(v, 1, 10_000)) {
            policy.batch_size = batch as u32;
        }
        let relay_poll_interval = read("RELAY_POLL_INTERVAL_MS", |v| whole_number(v, 1, 3_600_000))
            .map_or(policy.poll_interval, ms);
        if let Some(interval) = read("CONSUMER_POLL_INTERVAL_MS", |v| {
            whole_number(v, 1, 3_600_000)
        }) {
            policy.poll_interval = ms(interval);
        }
        if let Some(lease) = read("DELIVERY_LEASE_MS", |v| whole_number(v, 1, 86_400_000)) {
            policy.lease = Some(ms(lease));
        }
        if let Some(max) = read("MAX_PAYLOAD_BYTES", |v| whole_number(v, 1, 1_073_741_824)) {
            policy.max_payload_bytes = max as usize;
        }
        if let Some(timeout) = read("STORE_TIMEOUT_MS", |v| whole_number(v, 1, 3_600_000)) {
            policy.store_timeout = ms(timeout);
        }
        let mut settings = AppConfig {
            database: Database::default(),
            policy,
            relay_poll_interval,
            scheduler: SchedulerConfig {
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
            // Read below, beside the transport: `read` takes numbers.
            worker_addr: DEFAULT_WORKER_ADDR,
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
            allow_insecure_connections: read("HEXERACT_ALLOW_INSECURE_CONNECTIONS", |v| {
                whole_number(v, 0, 1)
            }) == Some(1),
        };
        // Its problems are pushed with the others' at the end (`read` holds `problems`).
        let mut transport_problems = Vec::new();
        if let Some(address) = lookup("WORKER_ADDR") {
            match address.trim().parse::<std::net::IpAddr>() {
                Ok(parsed) => settings.worker_addr = parsed,
                Err(_) => transport_problems.push(ConfigProblem {
                    setting: "WORKER_ADDR".to_owned(),
                    value: address,
                    expected: "an IP address to listen on, such as 0.0.0.0 (every interface), \
                               127.0.0.1 or ::"
                        .to_owned(),
                }),
            }
        }
        // `HEXERACT_TRANSPORT` chooses the transport by name (a broker's URL then has a
        // default); unset, `AMQP_URL` or `KAFKA_BROKERS` choose it.
        let (amqp_url, kafka_brokers) = match lookup("HEXERACT_TRANSPORT") {
            None => (lookup("AMQP_URL"), lookup("KAFKA_BROKERS")),
            Some(chosen) => {
                let (allowed, urls) = match chosen.trim() {
                    "store" => (&[][..], (None, None)),
                    "rabbitmq" => (
                        &["AMQP_URL"][..],
                        (
                            Some(lookup("AMQP_URL").unwrap_or_else(|| DEFAULT_AMQP_URL.to_owned())),
                            None,
                        ),
                    ),
                    "kafka" => (
                        &["KAFKA_BROKERS"][..],
                        (
                            None,
                            Some(
                                lookup("KAFKA_BROKERS")
                                    .unwrap_or_else(|| DEFAULT_KAFKA_BROKERS.to_owned()),
                            ),
                        ),
                    ),
                    _ => {
                        transport_problems.push(ConfigProblem {
                            setting: "HEXERACT_TRANSPORT".to_owned(),
                            value: chosen.clone(),
                            expected: "store, rabbitmq or kafka (unset: chosen by AMQP_URL or \
                                       KAFKA_BROKERS)"
                                .to_owned(),
                        });
                        (&["AMQP_URL", "KAFKA_BROKERS"][..], (None, None))
                    }
                };
                let conflicting: Vec<&str> = ["AMQP_URL", "KAFKA_BROKERS"]
                    .into_iter()
                    .filter(|name| !allowed.contains(name) && lookup(name).is_some())
                    .collect();
                if !conflicting.is_empty() {
                    transport_problems.push(ConfigProblem {
                        setting: "HEXERACT_TRANSPORT".to_owned(),
                        value: chosen.clone(),
                        expected: format!(
                            "a transport the other settings agree with: {} {} set too; unset \
                             {}, or choose the transport {}",
                            conflicting.join(" and "),
                            if conflicting.len() == 1 { "is" } else { "are" },
                            if conflicting.len() == 1 { "it" } else { "them" },
                            if conflicting.len() == 1 {
                                "it names"
                            } else {
                                "they name"
                            },
                        ),
                    });
                }
                urls
            }
        };
        // Checked with or without a broker, like AMQP_PREFETCH below.
        let partitions =
            read("KAFKA_TOPIC_PARTITIONS", |v| whole_number(v, 1, 10_000)).map(|n| n as u32);
        let replication_factor =
            read("KAFKA_REPLICATION_FACTOR", |v| whole_number(v, 1, 100)).map(|n| n as u32);
        // Checked whether or not a broker is set: a value that is wrong is wrong before the
        // broker is added too, and should not wait for that day to be found.
        if let Some(prefetch) = read("AMQP_PREFETCH", |v| whole_number(v, 1, 65_535)) {
            if amqp_url.is_some() {
                settings.policy.prefetch = prefetch as u32;
            }
        }
        let max_message_size = read("AMQP_MAX_MESSAGE_SIZE", |v| whole_number(v, 1, 536_870_912));
        let allow_unrouted: Vec<String> = lookup("AMQP_ALLOW_UNROUTED")
            .map(|types| {
                types
                    .split(',')
                    .map(str::trim)
                    .filter(|name| !name.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        if let Some(url) = amqp_url {
            let name = |variable: &str, default: &str| {
                lookup(variable).unwrap_or_else(|| default.to_owned())
            };
            settings.amqp = Some(Amqp {
                exchange: name("HEXERACT_EXCHANGE", "hexeract"),
                queue_prefix: name("HEXERACT_QUEUE_PREFIX", "hexeract"),
                max_message_size: max_message_size
                    .map_or_else(default_max_message_size, |bytes| bytes as usize),
                allow_unrouted,
                url,
            });
        }
        match (lookup("DATABASE_URL"), lookup("HEXERACT_SQLITE_PATH")) {
            (Some(url), None) => settings.database = Database::Postgres(url),
            (None, Some(path)) => settings.database = Database::Sqlite(PathBuf::from(path)),
            (Some(url), Some(_)) => problems.push(ConfigProblem {
                setting: "DATABASE_URL".to_owned(),
                value: redact_url(&url),
                expected:
                    "either DATABASE_URL (PostgreSQL) or HEXERACT_SQLITE_PATH (SQLite), not both"
                        .to_owned(),
            }),
            (None, None) => {}
        }
        if let Some(brokers) = kafka_brokers {
            settings.kafka = Some(Kafka {
                brokers,
                topic_prefix: lookup("KAFKA_TOPIC_PREFIX").unwrap_or_else(executable_name),
                partitions,
                replication_factor,
                security: KafkaSecurity {
                    protocol: lookup("KAFKA_SECURITY_PROTOCOL"),
                    sasl_mechanism: lookup("KAFKA_SASL_MECHANISM"),
                    sasl_username: lookup("KAFKA_SASL_USERNAME"),
                    sasl_password: lookup("KAFKA_SASL_PASSWORD"),
                    ssl_ca_location: lookup("KAFKA_SSL_CA_LOCATION"),
                },
            });
        }
        problems.extend(transport_problems);
        problems.extend(settings.problems());
        if problems.is_empty() {
            Ok(settings)
        } else {
            Err(ConfigError { problems })
        }
    }

    /// Checks the settings as [`from_env`](AppConfig::from_env) does, for settings built in
    /// code or loaded from a file: every problem at once, named by its variable.
    pub fn check(&self) -> Result<(), ConfigError> {
        let problems = self.problems();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { problems })
        }
    }

    /// The database and broker URLs that reach another machine without verified TLS: each
    /// variable, with its URL and why ([`secure`](crate::secure)). Refused by
    /// [`check`](AppConfig::check) unless `allow_insecure_connections`; `run` logs them
    /// when allowed.
    pub(crate) fn insecure_connections(&self) -> Vec<(&'static str, (&str, String))> {
        let mut insecure = Vec::new();
        if let Database::Postgres(url) = &self.database {
            if let crate::secure::Security::Insecure(why) = crate::secure::postgres(url) {
                insecure.push(("DATABASE_URL", (url.as_str(), why)));
            }
        }
        if let Some(amqp) = &self.amqp {
            if let crate::secure::Security::Insecure(why) = crate::secure::amqp(&amqp.url) {
                insecure.push(("AMQP_URL", (amqp.url.as_str(), why)));
            }
        }
        if let Some(kafka) = &self.kafka {
            let protocol = kafka.security.protocol.as_deref();
            if let (_, crate::secure::Security::Insecure(why)) =
                crate::secure::kafka(&kafka.brokers, protocol)
            {
                insecure.push(("KAFKA_BROKERS", (kafka.brokers.as_str(), why)));
            }
        }
        insecure
    }

    fn problems(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        if let Some(amqp) = &self.amqp {
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
            if self.kafka.is_some() {
                problems.push(ConfigProblem {
                    setting: "AMQP_URL".to_owned(),
                    value: redact_url(&amqp.url),
                    expected: "either AMQP_URL (RabbitMQ) or KAFKA_BROKERS (Kafka), not both"
                        .to_owned(),
                });
            }
        }
        if !self.allow_insecure_connections {
            for (setting, url) in self.insecure_connections() {
                problems.push(ConfigProblem {
                    setting: setting.to_owned(),
                    value: redact_url(url.0),
                    expected: format!(
                        "a connection to another machine over verified TLS, not this one ({}): \
                         {}, or set HEXERACT_ALLOW_INSECURE_CONNECTIONS=1 if the network \
                         between is trusted (logged at startup)",
                        url.1,
                        match setting {
                            "DATABASE_URL" => {
                                "leave sslmode unset (it then means verify-full) or set \
                                 sslmode=verify-full"
                            }
                            "KAFKA_BROKERS" => {
                                "set KAFKA_SECURITY_PROTOCOL to ssl or sasl_ssl (or leave it \
                                 unset)"
                            }
                            _ => "use an amqps:// URL (with ?cacertfile=… for a private CA)",
                        }
                    ),
                });
            }
        }
        match &self.database {
            Database::Postgres(url) => {
                if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                    problems.push(ConfigProblem {
                        setting: "DATABASE_URL".to_owned(),
                        value: redact_url(url),
                        expected: "a postgres:// URL (unset it to use SQLite)".to_owned(),
                    });
                }
            }
            Database::Sqlite(path) => {
                if path.as_os_str().to_string_lossy().trim().is_empty() {
                    problems.push(ConfigProblem {
                        setting: "HEXERACT_SQLITE_PATH".to_owned(),
                        value: path.display().to_string(),
                        expected: "a file path".to_owned(),
                    });
                }
            }
        }
        if let Some(kafka) = &self.kafka {
            if let Err(expected) = broker_list(&kafka.brokers) {
                problems.push(ConfigProblem {
                    setting: "KAFKA_BROKERS".to_owned(),
                    value: kafka.brokers.clone(),
                    expected,
                });
            }
            problems.extend(kafka.security.problems(&kafka.brokers));
            if let Err(expected) = topic_prefix_ok(&kafka.topic_prefix) {
                problems.push(ConfigProblem {
                    setting: "KAFKA_TOPIC_PREFIX".to_owned(),
                    value: kafka.topic_prefix.clone(),
                    expected,
                });
            }
        }
        self.range_problems(&mut problems);
        problems
    }

    /// Every number within the bounds its variable has (`from_env` refuses the same values
    /// when it reads them), named by its variable.
    fn range_problems(&self, problems: &mut Vec<ConfigProblem>) {
        let policy = &self.policy;
        let ms = |duration: Duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        let retention = |age: Option<Duration>| age.map_or(0, |age| age.as_secs() / 86_400);
        let mut numbers: Vec<(&str, u64, u64, u64)> = vec![
            (
                "MAX_DELIVERIES",
                policy.retry.max_deliveries_value().into(),
                1,
                1_000,
            ),
            (
                "RETRY_MAX_DELAY_MS",
                ms(policy.retry.delays().1),
                1,
                86_400_000,
            ),
            (
                "HANDLER_TIMEOUT_MS",
                ms(policy.handler_timeout),
                1,
                86_400_000,
            ),
            ("SHUTDOWN_GRACE_MS", ms(policy.shutdown_grace), 0, 3_600_000),
            ("RELAY_BATCH_SIZE", policy.batch_size.into(), 1, 10_000),
            (
                "RELAY_POLL_INTERVAL_MS",
                ms(self.relay_poll_interval),
                1,
                3_600_000,
            ),
            (
                "CONSUMER_POLL_INTERVAL_MS",
                ms(policy.poll_interval),
                1,
                3_600_000,
            ),
            (
                "MAX_PAYLOAD_BYTES",
                policy.max_payload_bytes as u64,
                1,
                1_073_741_824,
            ),
            ("STORE_TIMEOUT_MS", ms(policy.store_timeout), 1, 3_600_000),
            ("AMQP_PREFETCH", policy.prefetch.into(), 1, 65_535),
            ("WORKER_PORT", self.worker_port.into(), 0, 65_535),
            (
                "INBOX_RETENTION_DAYS",
                retention(self.inbox_retention),
                0,
                36_500,
            ),
            (
                "DEAD_LETTER_RETENTION_DAYS",
                retention(self.dead_letter_retention),
                0,
                36_500,
            ),
            // Not variables: a settings file's own knobs.
            (
                "policy.retry.initial_delay_ms",
                ms(policy.retry.delays().0),
                1,
                86_400_000,
            ),
            (
                "policy.min_cycle_delay_ms",
                ms(policy.min_cycle_delay),
                0,
                60_000,
            ),
        ];
        if let Some(limit) = policy.concurrency {
            numbers.push(("policy.concurrency", limit.into(), 1, 10_000));
        }
        let scheduler = &self.scheduler;
        let kafka_knob =
            |knob: fn(&Kafka) -> Option<u32>| self.kafka.as_ref().and_then(knob).map(u64::from);
        let optional = [
            ("DELIVERY_LEASE_MS", policy.lease.map(ms), 1, 86_400_000),
            (
                "SCHEDULER_POLL_INTERVAL_MS",
                scheduler.poll_interval.map(ms),
                1,
                3_600_000,
            ),
            (
                "SCHEDULER_BATCH_SIZE",
                scheduler.batch_size.map(u64::from),
                1,
                10_000,
            ),
            (
                "SCHEDULER_MIN_CYCLE_DELAY_MS",
                scheduler.min_cycle_delay.map(ms),
                0,
                60_000,
            ),
            (
                "SCHEDULER_DISPATCH_TIMEOUT_MS",
                scheduler.dispatch_timeout.map(ms),
                1,
                86_400_000,
            ),
            ("SCHEDULER_LEASE_MS", scheduler.lease.map(ms), 1, 86_400_000),
            (
                "KAFKA_TOPIC_PARTITIONS",
                kafka_knob(|kafka| kafka.partitions),
                1,
                10_000,
            ),
            (
                "KAFKA_REPLICATION_FACTOR",
                kafka_knob(|kafka| kafka.replication_factor),
                1,
                100,
            ),
        ];
        numbers.extend(
            optional
                .into_iter()
                .filter_map(|(name, value, min, max)| Some((name, value?, min, max))),
        );
        for (setting, value, min, max) in numbers {
            if let Err(expected) = whole_number(&value.to_string(), min, max) {
                problems.push(ConfigProblem {
                    setting: setting.to_owned(),
                    value: value.to_string(),
                    expected,
                });
            }
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
            "not empty: the prefix of every topic and consumer group (unset, it is the \
             executable's name)"
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

/// A retention as whole days, 0 for "kept forever" (`None`), for serde.
pub(crate) mod days {
    use std::time::Duration;

    pub(crate) fn serialize<S: serde::Serializer>(
        value: &Option<Duration>,
        to: S,
    ) -> Result<S::Ok, S::Error> {
        // Whole days, rounded up: a retention under a day is not "kept forever" (0).
        to.serialize_u64(value.map_or(0, |age| age.as_secs().div_ceil(86_400).max(1)))
    }

    pub(crate) fn deserialize<'de, D: serde::Deserializer<'de>>(
        from: D,
    ) -> Result<Option<Duration>, D::Error> {
        <u64 as serde::Deserialize>::deserialize(from).map(|days| super::retention(Some(days), 0))
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

    /// The settings `vars` read into.
    fn config(vars: &'static [(&'static str, &'static str)]) -> AppConfig {
        AppConfig::from_lookup(lookup(vars)).unwrap()
    }

    /// The error reading `vars` stops at, as it is shown.
    fn refusal(vars: &'static [(&'static str, &'static str)]) -> String {
        AppConfig::from_lookup(lookup(vars))
            .unwrap_err()
            .to_string()
    }

    /// Asserts that `text` contains `part`.
    #[track_caller]
    fn assert_mentions(text: &str, part: &str) {
        assert!(text.contains(part), "{part:?} not in {text}");
    }

    #[test]
    fn unset_variables_leave_defaults() {
        assert_eq!(
            AppConfig::from_lookup(lookup(&[])),
            Ok(AppConfig::default())
        );
    }

    #[test]
    fn valid_variables_are_read() {
        let settings = config(&[
            ("MAX_DELIVERIES", "3"),
            ("RETRY_MAX_DELAY_MS", "2500"),
            ("SHUTDOWN_GRACE_MS", "0"),
            ("RELAY_BATCH_SIZE", "250"),
            (
                "DATABASE_URL",
                "postgres://app:pw@db:5432/app?sslmode=verify-full",
            ),
        ]);
        assert_eq!(settings.policy.retry.max_deliveries_value(), 3);
        assert_eq!(
            settings.policy.retry.delays().1,
            Duration::from_millis(2500)
        );
        assert_eq!(settings.policy.shutdown_grace, Duration::ZERO);
        assert_eq!(settings.policy.batch_size, 250);
        assert_eq!(
            settings.database,
            Database::Postgres("postgres://app:pw@db:5432/app?sslmode=verify-full".into())
        );
        assert!(!format!("{:?}", settings.database).contains("pw"));
    }

    #[test]
    fn every_invalid_variable_is_reported_at_once_without_secrets() {
        let error = AppConfig::from_lookup(lookup(&[
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
        assert_mentions(
            &text,
            "MAX_DELIVERIES = \"0\": a whole number from 1 to 1000",
        );
        assert_mentions(&text, "mysql://user:***@db/app");
        assert!(
            !text.contains("secret"),
            "a password reached the error: {text}"
        );
    }

    #[test]
    fn retention_defaults_to_7_and_30_days_and_0_keeps_forever() {
        let defaults = config(&[]);
        assert_eq!(
            defaults.inbox_retention,
            Some(Duration::from_secs(7 * 86_400))
        );
        assert_eq!(
            defaults.dead_letter_retention,
            Some(Duration::from_secs(30 * 86_400))
        );
        let set = config(&[
            ("INBOX_RETENTION_DAYS", "0"),
            ("DEAD_LETTER_RETENTION_DAYS", "90"),
        ]);
        assert_eq!(set.inbox_retention, None, "0: kept forever");
        assert_eq!(
            set.dead_letter_retention,
            Some(Duration::from_secs(90 * 86_400))
        );
        let error = refusal(&[("DEAD_LETTER_RETENTION_DAYS", "a month")]);
        assert_mentions(&error, "DEAD_LETTER_RETENTION_DAYS");
    }

    #[test]
    fn worker_addr_defaults_to_every_interface_and_a_bad_one_is_named() {
        let every = config(&[]).worker_addr;
        assert_eq!(every.to_string(), "0.0.0.0", "every interface, as before");
        let local = config(&[("WORKER_ADDR", "127.0.0.1")]).worker_addr;
        assert_eq!(local.to_string(), "127.0.0.1");
        let error = refusal(&[("WORKER_ADDR", "localhost")]);
        assert!(
            error.contains("WORKER_ADDR") && error.contains("an IP address"),
            "{error}"
        );
    }

    #[test]
    fn worker_port_defaults_to_8081_and_a_bad_one_is_named() {
        assert_eq!(config(&[]).worker_port, 8081);
        let settings = config(&[("WORKER_PORT", "9100")]);
        assert_eq!(settings.worker_port, 9100);
        for bad in [
            &[("WORKER_PORT", "65536")][..],
            &[("WORKER_PORT", "http")][..],
        ] {
            let error = refusal(bad);
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
            let error = refusal(vars);
            assert_mentions(&error, "AMQP_URL");
            assert_mentions(&error, "cacertfile");
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
        let settings = config(&[
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
        ]);
        assert_eq!(
            settings.scheduler,
            SchedulerConfig {
                poll_interval: Some(Duration::from_millis(250)),
                batch_size: Some(7),
                min_cycle_delay: Some(Duration::ZERO),
                dispatch_timeout: Some(Duration::from_millis(1234)),
                lease: Some(Duration::from_millis(4321)),
            }
        );
        assert_eq!(settings.policy.lease, Some(Duration::from_secs(60)));
        assert_eq!(settings.policy.max_payload_bytes, 4096);
        assert_eq!(settings.policy.store_timeout, Duration::from_millis(2500));
        assert_eq!(settings.policy.prefetch, 64);
        // Unset, each keeps the process's default (the scheduler's, its own builder's).
        let unset = config(&[("AMQP_URL", "amqp://localhost")]);
        assert_eq!(unset.scheduler, SchedulerConfig::default());
        let process = Policy::process();
        assert_eq!(
            (
                unset.policy.lease,
                unset.policy.max_payload_bytes,
                unset.policy.store_timeout
            ),
            (
                process.lease,
                process.max_payload_bytes,
                process.store_timeout
            )
        );
        assert_eq!(unset.policy.prefetch, process.prefetch);
        assert_eq!(
            unset.policy, process,
            "no variable set: the process's policy"
        );
    }

    #[test]
    fn worker_knobs_take_their_bounds_and_refuse_one_past_them() {
        for (name, min, max) in WORKER_KNOBS {
            let with = |value: String| {
                let mut vars = vec![(name, value)];
                if name == "AMQP_PREFETCH" {
                    vars.push(("AMQP_URL", "amqp://localhost".to_owned()));
                }
                AppConfig::from_lookup(owned_lookup(vars))
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
                assert_mentions(&text, &expected);
            }
        }
    }

    #[test]
    fn every_invalid_worker_knob_is_reported_at_once() {
        let error = AppConfig::from_lookup(lookup(&[
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
        assert_mentions(
            &text,
            "SCHEDULER_MIN_CYCLE_DELAY_MS = \"5ms\": a whole number from 0 to 60000",
        );
        assert_mentions(
            &text,
            "MAX_PAYLOAD_BYTES = \"1073741825\": a whole number from 1 to 1073741824",
        );
    }

    #[test]
    fn amqp_prefetch_applies_with_amqp_url_and_is_checked_without() {
        // Without a broker a valid value changes nothing, and an invalid one is still an error:
        // found now, not on the day AMQP_URL is added.
        let settings = config(&[("AMQP_PREFETCH", "64")]);
        assert_eq!(settings.amqp, None);
        assert_eq!(settings.policy.prefetch, Policy::process().prefetch);
        let error = refusal(&[("AMQP_PREFETCH", "0")]);
        assert_mentions(
            &error,
            "AMQP_PREFETCH = \"0\": a whole number from 1 to 65535",
        );
        let error = refusal(&[("AMQP_URL", "amqp://localhost"), ("AMQP_PREFETCH", "0")]);
        assert_mentions(
            &error,
            "AMQP_PREFETCH = \"0\": a whole number from 1 to 65535",
        );
    }

    /// A database or broker on another machine without verified TLS stops startup, naming
    /// the variable and the opt-out, without the password; with the opt-out it is accepted.
    #[test]
    fn connections_to_other_machines_must_verify_tls_unless_allowed() {
        let vars: &'static [(&str, &str)] = &[
            (
                "DATABASE_URL",
                "postgres://app:s3cret@db.internal/shop?sslmode=prefer",
            ),
            ("AMQP_URL", "amqp://app:s3cret@rabbit.internal/%2f"),
        ];
        let error = AppConfig::from_lookup(lookup(vars)).unwrap_err();
        let settings: Vec<_> = error.problems.iter().map(|p| p.setting.as_str()).collect();
        assert_eq!(settings, ["DATABASE_URL", "AMQP_URL"]);
        let text = error.to_string();
        assert_mentions(&text, "HEXERACT_ALLOW_INSECURE_CONNECTIONS=1");
        assert_mentions(&text, "sslmode=verify-full");
        assert_mentions(&text, "amqps://");
        assert!(!text.contains("s3cret"), "{text}");
        let allowed: &'static [(&str, &str)] = &[
            (
                "DATABASE_URL",
                "postgres://app:s3cret@db.internal/shop?sslmode=prefer",
            ),
            ("AMQP_URL", "amqp://app:s3cret@rabbit.internal/%2f"),
            ("HEXERACT_ALLOW_INSECURE_CONNECTIONS", "1"),
        ];
        let settings = config(allowed);
        assert!(settings.allow_insecure_connections);
        assert_eq!(settings.insecure_connections().len(), 2);
        // Verified or local: nothing to allow.
        let fine: &'static [(&str, &str)] = &[
            ("DATABASE_URL", "postgres://app@db.internal/shop"),
            ("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f"),
        ];
        assert!(AppConfig::from_lookup(lookup(fine)).is_ok());
    }

    /// Kafka brokers on another machine are reached over verified TLS by default, which needs
    /// the `kafka-tls` feature; plaintext to them is insecure; SASL needs its mechanism and
    /// credentials; the password never shows.
    #[test]
    fn kafka_security_follows_the_brokers_and_the_features() {
        let local = config(&[("KAFKA_BROKERS", "127.0.0.1:9092")]);
        let kafka = local.kafka.unwrap();
        assert_eq!(
            kafka.security.client_options(&kafka.brokers),
            [("security.protocol", "plaintext".to_owned())]
        );
        let remote = AppConfig::from_lookup(lookup(&[("KAFKA_BROKERS", "kafka-1.internal:9093")]));
        if cfg!(feature = "kafka-tls") {
            let kafka = remote.unwrap().kafka.unwrap();
            assert_eq!(
                kafka.security.client_options(&kafka.brokers)[0],
                ("security.protocol", "ssl".to_owned())
            );
        } else {
            let error = remote.unwrap_err().to_string();
            assert_mentions(&error, "KAFKA_SECURITY_PROTOCOL = \"ssl\"");
            assert_mentions(&error, "`kafka-tls` feature");
        }
        let plaintext = refusal(&[
            ("KAFKA_BROKERS", "kafka-1.internal:9093"),
            ("KAFKA_SECURITY_PROTOCOL", "plaintext"),
        ]);
        assert_mentions(&plaintext, "KAFKA_BROKERS");
        assert_mentions(&plaintext, "HEXERACT_ALLOW_INSECURE_CONNECTIONS=1");
        let sasl = config(&[
            ("KAFKA_BROKERS", "127.0.0.1:9092"),
            ("KAFKA_SECURITY_PROTOCOL", "sasl_plaintext"),
            ("KAFKA_SASL_MECHANISM", "PLAIN"),
            ("KAFKA_SASL_USERNAME", "app"),
            ("KAFKA_SASL_PASSWORD", "s3cret"),
        ]);
        let kafka = sasl.kafka.unwrap();
        assert!(kafka
            .security
            .client_options(&kafka.brokers)
            .contains(&("sasl.password", "s3cret".to_owned())));
        assert!(!format!("{kafka:?}").contains("s3cret"));
        let incomplete = refusal(&[
            ("KAFKA_BROKERS", "127.0.0.1:9092"),
            ("KAFKA_SECURITY_PROTOCOL", "sasl_plaintext"),
            ("KAFKA_SASL_MECHANISM", "PLAIN"),
        ]);
        assert_mentions(&incomplete, "KAFKA_SASL_PASSWORD");
        let gssapi = AppConfig::from_lookup(lookup(&[
            ("KAFKA_BROKERS", "127.0.0.1:9092"),
            ("KAFKA_SECURITY_PROTOCOL", "sasl_plaintext"),
            ("KAFKA_SASL_MECHANISM", "GSSAPI"),
        ]));
        assert_eq!(gssapi.is_ok(), cfg!(feature = "kafka-gssapi"), "{gssapi:?}");
        let unknown = refusal(&[
            ("KAFKA_BROKERS", "127.0.0.1:9092"),
            ("KAFKA_SECURITY_PROTOCOL", "tls"),
        ]);
        assert_mentions(&unknown, "plaintext, ssl, sasl_plaintext or sasl_ssl");
    }

    #[test]
    fn amqp_url_selects_the_broker_with_default_names() {
        let settings = config(&[("AMQP_URL", "amqps://app:pw@broker/vh")]);
        let amqp = settings.amqp.unwrap();
        assert_eq!(amqp.url, "amqps://app:pw@broker/vh");
        assert_eq!(
            (amqp.exchange.as_str(), amqp.queue_prefix.as_str()),
            ("hexeract", "hexeract")
        );
        assert!(!format!("{amqp:?}").contains("pw"));
        let both = refusal(&[
            ("AMQP_URL", "amqp://localhost"),
            ("KAFKA_BROKERS", "localhost:9092"),
        ]);
        assert_mentions(&both, "not both");
    }

    #[test]
    fn kafka_brokers_need_a_topic_prefix_and_valid_names() {
        let settings = config(&[
            ("KAFKA_BROKERS", "localhost:9092, 127.0.0.2:9093"),
            ("KAFKA_TOPIC_PREFIX", "shop"),
            ("KAFKA_TOPIC_PARTITIONS", "6"),
            ("KAFKA_REPLICATION_FACTOR", "1"),
        ]);
        assert_eq!(
            settings.kafka,
            Some(Kafka {
                brokers: "localhost:9092, 127.0.0.2:9093".to_owned(),
                topic_prefix: "shop".to_owned(),
                partitions: Some(6),
                replication_factor: Some(1),
                security: KafkaSecurity::default(),
            })
        );
        let error = AppConfig::from_lookup(lookup(&[
            ("KAFKA_BROKERS", "http://localhost"),
            ("KAFKA_TOPIC_PARTITIONS", "0"),
            ("KAFKA_REPLICATION_FACTOR", "three"),
        ]))
        .unwrap_err();
        let text = error.to_string();
        assert_eq!(error.problems.len(), 3, "{text}");
        assert_mentions(
            &text,
            "KAFKA_REPLICATION_FACTOR = \"three\": a whole number from 1 to 100",
        );
        assert_mentions(
            &text,
            "KAFKA_BROKERS = \"http://localhost\": a list of brokers as host:port",
        );
        // Unset, the prefix is the executable's name; set empty, it is refused.
        let defaulted = config(&[("KAFKA_BROKERS", "localhost:9092")])
            .kafka
            .unwrap();
        assert_eq!(defaulted.topic_prefix, executable_name());
        assert!(
            defaulted.topic_prefix.starts_with("hexeract"),
            "{defaulted:?}"
        );
        let empty = refusal(&[
            ("KAFKA_BROKERS", "localhost:9092"),
            ("KAFKA_TOPIC_PREFIX", ""),
        ]);
        assert_mentions(
            &empty,
            "KAFKA_TOPIC_PREFIX = \"\": not empty: the prefix of every topic",
        );
        assert_mentions(
            &text,
            "KAFKA_TOPIC_PARTITIONS = \"0\": a whole number from 1 to 10000",
        );
        let bad_prefix = refusal(&[
            ("KAFKA_BROKERS", "localhost:9092"),
            ("KAFKA_TOPIC_PREFIX", "my shop"),
        ]);
        assert_mentions(&bad_prefix, "Kafka's topic name characters");
        // Without brokers a valid value changes nothing, and an invalid one is still an error.
        let unused = config(&[
            ("KAFKA_TOPIC_PARTITIONS", "6"),
            ("KAFKA_REPLICATION_FACTOR", "2"),
        ]);
        assert_eq!(unused.kafka, None);
        let invalid = refusal(&[("KAFKA_TOPIC_PARTITIONS", "0")]);
        assert_mentions(
            &invalid,
            "KAFKA_TOPIC_PARTITIONS = \"0\": a whole number from 1 to 10000",
        );
    }

    /// Every variable docs/configuration.md lists, set alone to a value that is not its
    /// default, changes the settings: each maps to a field.
    #[test]
    fn every_documented_variable_maps_to_a_field() {
        let doc = include_str!("../../docs/configuration.md");
        let documented: std::collections::BTreeSet<&str> = doc
            .lines()
            .filter_map(|line| line.strip_prefix("| `"))
            .filter_map(|rest| rest.split('`').next())
            .filter(|name| name.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
            .collect();
        assert!(documented.len() >= 27, "{documented:?}");
        // Variables that only apply beside another one.
        let needs: &[(&str, &[(&str, &str)])] = &[
            ("AMQP_PREFETCH", &[("AMQP_URL", "amqp://localhost")]),
            ("AMQP_MAX_MESSAGE_SIZE", &[("AMQP_URL", "amqp://localhost")]),
            ("AMQP_ALLOW_UNROUTED", &[("AMQP_URL", "amqp://localhost")]),
            ("HEXERACT_EXCHANGE", &[("AMQP_URL", "amqp://localhost")]),
            ("HEXERACT_QUEUE_PREFIX", &[("AMQP_URL", "amqp://localhost")]),
            (
                "KAFKA_TOPIC_PARTITIONS",
                &[
                    ("KAFKA_BROKERS", "localhost:9092"),
                    ("KAFKA_TOPIC_PREFIX", "shop"),
                ],
            ),
            (
                "KAFKA_REPLICATION_FACTOR",
                &[
                    ("KAFKA_BROKERS", "localhost:9092"),
                    ("KAFKA_TOPIC_PREFIX", "shop"),
                ],
            ),
            (
                "KAFKA_TOPIC_PREFIX",
                &[
                    ("KAFKA_BROKERS", "localhost:9092"),
                    ("KAFKA_TOPIC_PREFIX", "shop"),
                ],
            ),
            ("KAFKA_BROKERS", &[("KAFKA_TOPIC_PREFIX", "shop")]),
            (
                "KAFKA_SECURITY_PROTOCOL",
                &[
                    ("KAFKA_BROKERS", "localhost:9092"),
                    ("KAFKA_TOPIC_PREFIX", "shop"),
                ],
            ),
        ];
        // Read by the testing toolkit (`TestDatabase::create_from_env`), not a setting of the
        // application: its row says so.
        for name in documented
            .into_iter()
            .filter(|name| *name != "TEST_DATABASE_URL")
        {
            let value = match name {
                "AMQP_URL" => "amqp://localhost",
                "DATABASE_URL" => "postgres://localhost/app",
                "HEXERACT_SQLITE_PATH" => "other.db",
                "HEXERACT_EXCHANGE" | "HEXERACT_QUEUE_PREFIX" | "KAFKA_TOPIC_PREFIX" => "other",
                "KAFKA_BROKERS" => "127.0.0.3:9093",
                "KAFKA_SECURITY_PROTOCOL" => "plaintext",
                "HEXERACT_TRANSPORT" => "kafka",
                "WORKER_PORT" => "9999",
                "WORKER_ADDR" => "127.0.0.1",
                "HEXERACT_ALLOW_INSECURE_CONNECTIONS" => "1",
                _ => "11",
            };
            let base: Vec<(String, String)> = needs
                .iter()
                .find(|(variable, _)| *variable == name)
                .map(|(_, with)| {
                    with.iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect()
                })
                .unwrap_or_default();
            let read = |vars: &[(String, String)]| {
                AppConfig::from_lookup(|wanted| {
                    vars.iter()
                        .find(|(key, _)| key == wanted)
                        .map(|(_, v)| v.clone())
                })
                .unwrap_or_else(|error| panic!("{name}: {error}"))
            };
            let mut with = base.clone();
            with.retain(|(key, _)| key != name);
            with.push((name.to_owned(), value.to_owned()));
            assert_ne!(read(&with), read(&base), "{name} = {value} changed nothing");
        }
    }

    #[test]
    fn a_config_file_reads_into_the_same_settings_as_the_variables() {
        let from_vars = config(&[
            ("DATABASE_URL", "postgres://app@db/shop"),
            ("HANDLER_TIMEOUT_MS", "5000"),
            ("MAX_DELIVERIES", "3"),
            ("RELAY_POLL_INTERVAL_MS", "250"),
            ("INBOX_RETENTION_DAYS", "0"),
            ("AMQP_URL", "amqps://rabbit"),
            ("AMQP_PREFETCH", "32"),
            ("SCHEDULER_LEASE_MS", "60000"),
        ]);
        let from_file: AppConfig = serde_json::from_str(
            r#"{
                "database": { "postgres": "postgres://app@db/shop" },
                "policy": { "handler_timeout_ms": 5000, "retry": { "max_deliveries": 3 }, "prefetch": 32 },
                "relay_poll_interval_ms": 250,
                "inbox_retention_days": 0,
                "amqp": { "url": "amqps://rabbit" },
                "scheduler": { "lease_ms": 60000 }
            }"#,
        )
        .unwrap();
        assert_eq!(from_file, from_vars);
        // And back: what it writes, it reads.
        let written = serde_json::to_string(&from_file).unwrap();
        assert_eq!(
            serde_json::from_str::<AppConfig>(&written).unwrap(),
            from_file
        );
        assert_eq!(
            serde_json::from_str::<AppConfig>("{}").unwrap(),
            AppConfig::default()
        );
    }

    #[test]
    fn a_config_file_with_an_unknown_key_or_bad_values_is_refused() {
        let typo = serde_json::from_str::<AppConfig>(r#"{ "policy": { "handler_timout_ms": 5 } }"#)
            .unwrap_err()
            .to_string();
        assert_mentions(&typo, "unknown field `handler_timout_ms`");
        let config: AppConfig = serde_json::from_str(
            r#"{ "database": { "postgres": "mysql://u:secret@db/app" },
                 "amqp": { "url": "amqps://x", "exchange": "amq.direct" },
                 "policy": { "handler_timeout_ms": 0 } }"#,
        )
        .unwrap();
        let error = config.check().unwrap_err();
        let settings: Vec<_> = error.problems.iter().map(|p| p.setting.as_str()).collect();
        assert_eq!(
            settings,
            ["HEXERACT_EXCHANGE", "DATABASE_URL", "HANDLER_TIMEOUT_MS"]
        );
        assert!(!error.to_string().contains("secret"), "{error}");
        // Every number from a file is held to its variable's bounds, named by the variable.
        let config: AppConfig = serde_json::from_str(
            r#"{ "policy": { "prefetch": 0, "retry": { "jitter": 7, "max_delay_ms": 0 } },
                 "relay_poll_interval_ms": 0, "inbox_retention_days": 99999999999999,
                 "scheduler": { "lease_ms": 0 } }"#,
        )
        .unwrap();
        assert_eq!(config.policy.retry.delays().1, Duration::ZERO);
        let error = config.check().unwrap_err();
        let settings: Vec<_> = error.problems.iter().map(|p| p.setting.as_str()).collect();
        assert_eq!(
            settings,
            [
                "RETRY_MAX_DELAY_MS",
                "RELAY_POLL_INTERVAL_MS",
                "AMQP_PREFETCH",
                "INBOX_RETENTION_DAYS",
                "SCHEDULER_LEASE_MS"
            ]
        );
        // The jitter is kept within its bounds, as the setter keeps it.
        let jitter: crate::RetryPolicy = serde_json::from_str(r#"{ "jitter": 7 }"#).unwrap();
        assert_eq!(jitter, crate::RetryPolicy::default().jitter(1.0));
    }

    #[test]
    fn hexeract_transport_chooses_by_name_with_the_brokers_defaults() {
        let kafka = config(&[("HEXERACT_TRANSPORT", "kafka")]);
        assert_eq!(
            kafka.kafka,
            Some(Kafka {
                brokers: "localhost:9092".to_owned(),
                topic_prefix: executable_name(),
                partitions: None,
                replication_factor: None,
                security: KafkaSecurity::default(),
            })
        );
        assert_eq!(kafka.amqp, None);
        let rabbitmq = config(&[("HEXERACT_TRANSPORT", "rabbitmq")]);
        assert_eq!(
            rabbitmq.amqp.map(|amqp| amqp.url),
            Some("amqp://guest:guest@localhost:5672/%2f".to_owned())
        );
        let named = config(&[
            ("HEXERACT_TRANSPORT", "kafka"),
            ("KAFKA_BROKERS", "127.0.0.2:9092"),
            ("KAFKA_TOPIC_PREFIX", "shop"),
        ]);
        assert_eq!(named.kafka.unwrap().brokers, "127.0.0.2:9092");
        let store = config(&[("HEXERACT_TRANSPORT", "store")]);
        assert_eq!((store.amqp, store.kafka), (None, None));
    }

    #[test]
    fn hexeract_transport_refuses_settings_of_another_transport_in_one_error() {
        let error = AppConfig::from_lookup(lookup(&[
            ("HEXERACT_TRANSPORT", "store"),
            ("AMQP_URL", "amqp://guest:secret@rabbit"),
            ("KAFKA_BROKERS", "kafka:9092"),
        ]))
        .unwrap_err();
        let problems: Vec<_> = error
            .problems
            .iter()
            .filter(|problem| problem.setting == "HEXERACT_TRANSPORT")
            .collect();
        assert_eq!(problems.len(), 1, "{error}");
        assert_eq!(
            problems[0].expected,
            "a transport the other settings agree with: AMQP_URL and KAFKA_BROKERS are set too; \
             unset them, or choose the transport they name"
        );
        let error = refusal(&[
            ("HEXERACT_TRANSPORT", "kafka"),
            ("AMQP_URL", "amqp://rabbit"),
        ]);
        assert_mentions(&error, "HEXERACT_TRANSPORT = \"kafka\": a transport the other settings agree with: AMQP_URL is set too");
        let error = refusal(&[("HEXERACT_TRANSPORT", "nats")]);
        assert_mentions(
            &error,
            "HEXERACT_TRANSPORT = \"nats\": store, rabbitmq or kafka",
        );
    }
}
