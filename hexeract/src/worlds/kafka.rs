//! Kafka: the transport that keeps each aggregate's messages in order (feature `kafka`).
//!
//! Every message sent through Kafka declares an aggregate (`#[message(type = "OrderPlaced",
//! aggregate = "order")]` with a `#[message(key)]` field). The relay publishes it to the
//! aggregate's topic, `<prefix>.<aggregate>`, keyed by the aggregate id: one aggregate's
//! messages land in one partition, in the order they were written to the outbox. Each handler
//! is the consumer group `<prefix>.<handler name>` on the topic of its message type's
//! aggregate; its records are handled one at a time per partition, and a partition's offset is
//! committed only once the record's outcome is settled (handled, or written to the database's
//! `dead_letters`). A record that fails is retried where it is (1 s → 300 s, `MAX_DELIVERIES`
//! calls), holding back the records behind it in its partition and no other. The pieces:
//!
//! - [`KafkaConfig`]: brokers, topic prefix, partitions and replicas of the topics created,
//!   client options;
//! - [`ensure_topics`]: creates the aggregates' topics (existing ones are left as they are);
//! - [`KafkaRelay`]: moves the transactional outbox to the topics with an idempotent producer
//!   (`acks=all`), a row deleted only once the broker acknowledged it; passes of several relays
//!   on one store never overlap, so they cannot reorder an aggregate;
//! - [`KafkaWorker`]: one consumer group per handler.
//!
//! `hexeract::run` wires them when `KAFKA_BROKERS` is set (`docs/kafka.md`).

mod admin;
mod logged;
mod relay;
pub mod wire;
mod worker;

use std::collections::BTreeMap;
use std::fmt;

pub use admin::ensure_topics;
pub use relay::KafkaRelay;
pub use worker::{KafkaSource, KafkaWorker, KafkaWorkerBuilder};

/// Partitions of each topic Hexeract creates, unless [`KafkaConfig::partitions`] says
/// otherwise (`KAFKA_TOPIC_PARTITIONS`).
pub const DEFAULT_PARTITIONS: i32 = 3;

/// Replicas of each topic Hexeract creates, unless [`KafkaConfig::replication_factor`] says
/// otherwise (`KAFKA_REPLICATION_FACTOR`): with `min.insync.replicas` 2, a record the relay saw
/// acknowledged (and whose outbox row it deleted) survives the loss of any one broker.
pub const DEFAULT_REPLICATION_FACTOR: i32 = 3;

/// Where the Kafka transport connects and how it names things.
///
/// ```
/// use hexeract::kafka::KafkaConfig;
///
/// let config = KafkaConfig::new("localhost:9092", "shop").partitions(6);
/// assert_eq!(config.topic("order"), "shop.order");
/// assert_eq!(config.group("shop::reserve_stock"), "shop.shop.reserve_stock");
///
/// // A single local broker keeps one copy of each record.
/// let local = KafkaConfig::new("localhost:9092", "shop").replication_factor(1);
/// ```
#[derive(Clone, PartialEq, Eq)]
#[must_use = "a configuration does nothing until given to a worker or relay"]
pub struct KafkaConfig {
    brokers: String,
    prefix: String,
    partitions: i32,
    replication_factor: i32,
    options: BTreeMap<String, String>,
    consumer_options: BTreeMap<String, String>,
}

impl KafkaConfig {
    /// Brokers as `host:port[,host:port…]` (librdkafka's `bootstrap.servers`), and the prefix of
    /// every topic and consumer group name.
    pub fn new(brokers: impl Into<String>, prefix: impl Into<String>) -> KafkaConfig {
        KafkaConfig {
            brokers: brokers.into(),
            prefix: prefix.into(),
            partitions: DEFAULT_PARTITIONS,
            replication_factor: DEFAULT_REPLICATION_FACTOR,
            options: BTreeMap::new(),
            consumer_options: BTreeMap::new(),
        }
    }

    /// Partitions of the topics [`ensure_topics`] creates (default 3). More partitions allow more
    /// consumers of one handler to share the work; one aggregate always stays in one partition.
    pub fn partitions(mut self, partitions: i32) -> KafkaConfig {
        self.partitions = partitions;
        self
    }

    /// Replicas of the topics [`ensure_topics`] creates (default 3, `KAFKA_REPLICATION_FACTOR`),
    /// which it creates with `min.insync.replicas` 2 (1 when the factor is 1): with the
    /// relay's `acks=all`, a record is acknowledged, and its outbox row deleted, only once two
    /// brokers have it. [`ensure_topics`] fails when the cluster has fewer brokers than this,
    /// and warns about existing topics with fewer replicas. A single local broker needs 1.
    ///
    /// ```
    /// use hexeract::kafka::KafkaConfig;
    ///
    /// let local = KafkaConfig::new("127.0.0.1:9092", "shop").replication_factor(1);
    /// ```
    pub fn replication_factor(mut self, replicas: i32) -> KafkaConfig {
        self.replication_factor = replicas;
        self
    }

    /// Sets a librdkafka option on every client (producer, consumers, admin), such as
    /// `security.protocol`. Hexeract's own settings (idempotence, `acks`, offset storage)
    /// cannot be overridden: they are what its guarantees stand on.
    pub fn client_option(
        mut self,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> KafkaConfig {
        self.options.insert(key.into(), value.into());
        self
    }

    /// Sets a librdkafka option on the consumers only, such as `session.timeout.ms` (how long
    /// a consumer that vanished keeps its partitions; 45 s by default) or
    /// `partition.assignment.strategy`.
    pub fn consumer_option(
        mut self,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> KafkaConfig {
        self.consumer_options.insert(key.into(), value.into());
        self
    }

    /// The brokers.
    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// The prefix of topic and group names.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The topic of `aggregate`: `<prefix>.<aggregate>`.
    pub fn topic(&self, aggregate: &str) -> String {
        format!("{}.{aggregate}", self.prefix)
    }

    /// The consumer group of the handler `handler`: `<prefix>.<handler>`, with `::` as `.`
    /// (as the handler's RabbitMQ queue is named).
    pub fn group(&self, handler: &str) -> String {
        format!("{}.{}", self.prefix, handler.replace("::", "."))
    }

    /// The `ce_source` of every record the relay publishes: `/hexeract/<prefix>`.
    pub(crate) fn source(&self) -> String {
        format!("/hexeract/{}", self.prefix)
    }

    pub(crate) fn client(&self) -> rdkafka::ClientConfig {
        let mut config = rdkafka::ClientConfig::new();
        // librdkafka's warnings and errors go through the client contexts to `tracing`; with
        // the option `debug` (for example `cgrp,fetch`), its debug lines too.
        config.set_log_level(if self.options.contains_key("debug") {
            rdkafka::config::RDKafkaLogLevel::Debug
        } else {
            rdkafka::config::RDKafkaLogLevel::Warning
        });
        for (key, value) in &self.options {
            config.set(key, value);
        }
        config.set("bootstrap.servers", &self.brokers);
        config
    }

    pub(crate) fn consumer(&self) -> rdkafka::ClientConfig {
        let mut config = self.client();
        for (key, value) in &self.consumer_options {
            config.set(key, value);
        }
        config
    }

    pub(crate) fn partition_count(&self) -> i32 {
        self.partitions
    }

    pub(crate) fn replicas(&self) -> i32 {
        self.replication_factor
    }

    /// `min.insync.replicas` of the topics [`ensure_topics`] creates: 2, or the factor when it
    /// is smaller (with one replica, the one must do).
    pub(crate) fn min_insync_replicas(&self) -> i32 {
        self.replication_factor.clamp(1, 2)
    }
}

impl fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("prefix", &self.prefix)
            .field("partitions", &self.partitions)
            .field("replication_factor", &self.replication_factor)
            // Options may hold SASL passwords.
            .field("options", &self.options.keys().collect::<Vec<_>>())
            .field(
                "consumer_options",
                &self.consumer_options.keys().collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A Kafka operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaError {
    /// The client could not be created, or a call to the brokers failed.
    #[error("Kafka {operation} failed: {detail}")]
    Client {
        /// What was attempted.
        operation: String,
        /// What librdkafka said.
        detail: String,
    },
    /// The cluster lists fewer brokers than the replication factor of the topics: they could
    /// not hold the copies of each record the deployment asked for.
    #[error(
        "KAFKA_REPLICATION_FACTOR is {factor}, but the Kafka cluster lists {brokers} broker(s): \
         its topics cannot keep {factor} copies of each record; set KAFKA_REPLICATION_FACTOR \
         (KafkaConfig::replication_factor) to at most {brokers}, such as 1 for a single local \
         broker, or start the brokers that are missing"
    )]
    ReplicationFactor {
        /// The replication factor configured.
        factor: i32,
        /// The brokers the cluster's metadata lists.
        brokers: usize,
    },
    /// A handler's message type declares no aggregate: Kafka needs one to choose the topic and
    /// the partition.
    #[error(
        "handler `{handler}` handles `{message_type}`, which declares no aggregate: with Kafka \
         every message needs one, to choose its topic and keep its order; declare it with \
         #[message(type = \"{message_type}\", aggregate = \"…\")] and mark the aggregate id \
         field #[message(key)]"
    )]
    MissingAggregate {
        /// The handler.
        handler: String,
        /// Its message type.
        message_type: String,
    },
}

impl KafkaError {
    pub(crate) fn client(operation: impl Into<String>, error: impl fmt::Display) -> KafkaError {
        KafkaError::Client {
            operation: operation.into(),
            detail: error.to_string(),
        }
    }
}
