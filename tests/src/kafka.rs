//! Kafka for the integration tests: the brokers at `TEST_KAFKA_BROKERS` (default
//! `127.0.0.1:9092`, the broker `.ci/run` starts), a topic prefix of a test's own, and records
//! read or written around Hexeract's back.

use std::time::Duration;

use hexeract::kafka::KafkaConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::{ClientConfig, Message};
use uuid::Uuid;

/// The brokers the tests use unless `TEST_KAFKA_BROKERS` says otherwise.
pub const DEFAULT_BROKERS: &str = "127.0.0.1:9092";

/// `TEST_KAFKA_BROKERS`, or [`DEFAULT_BROKERS`].
pub fn brokers() -> String {
    std::env::var("TEST_KAFKA_BROKERS").unwrap_or_else(|_| DEFAULT_BROKERS.to_owned())
}

/// A record as read back from a topic.
#[derive(Clone, Debug)]
pub struct Record {
    /// Its partition.
    pub partition: i32,
    /// Its offset in the partition.
    pub offset: i64,
    /// Its key, as text.
    pub key: Option<String>,
    /// Its headers, as text.
    pub headers: Vec<(String, String)>,
    /// Its value.
    pub payload: Vec<u8>,
}

impl Record {
    /// The value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

/// A test's own names on the brokers: topics and groups under the prefix `t<uuid>`, on the
/// real broker ([`TestKafka::tansu`]) or on a librdkafka mock cluster of its own
/// ([`TestKafka::mock`]).
pub struct TestKafka {
    /// The prefix of the test's topics and groups.
    pub prefix: String,
    brokers: String,
    /// Set when the brokers are tansu (see [`TestKafka::config`]).
    tansu: bool,
    mock: Option<rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>>,
}

impl std::fmt::Debug for TestKafka {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestKafka")
            .field("prefix", &self.prefix)
            .field("brokers", &self.brokers)
            .field("mock", &self.mock.is_some())
            .finish()
    }
}

impl TestKafka {
    /// A fresh prefix on the brokers at `TEST_KAFKA_BROKERS` (tansu, unless
    /// `TEST_KAFKA_IS_KAFKA` is set), after checking that they answer.
    ///
    /// # Panics
    ///
    /// With a message naming `TEST_KAFKA_BROKERS` when they do not answer within 10 s.
    pub fn tansu() -> TestKafka {
        let consumer: BaseConsumer = client(&brokers()).create().expect("a Kafka client");
        if let Err(error) = consumer.fetch_metadata(None, Duration::from_secs(10)) {
            panic!(
                "cannot reach Kafka at {} ({error}); start a broker (.ci/run starts tansu on \
                 127.0.0.1:9092), or set TEST_KAFKA_BROKERS to brokers these tests may create \
                 topics on",
                brokers()
            );
        }
        TestKafka {
            prefix: format!("t{}", Uuid::now_v7().simple()),
            brokers: brokers(),
            tansu: std::env::var("TEST_KAFKA_IS_KAFKA").map_or(true, |value| value.is_empty()),
            mock: None,
        }
    }

    /// A librdkafka mock cluster of 3 brokers, in this process, for this test alone: the
    /// Kafka semantics tansu lacks (see `docs/kafka.md`), checked against librdkafka's own
    /// model of a broker.
    pub fn mock() -> TestKafka {
        TestKafka::mock_of(3)
    }

    /// A librdkafka mock cluster of `brokers` brokers (see [`TestKafka::mock`]).
    pub fn mock_of(brokers: i32) -> TestKafka {
        let mock = rdkafka::mocking::MockCluster::new(brokers).expect("a librdkafka mock cluster");
        TestKafka {
            prefix: format!("t{}", Uuid::now_v7().simple()),
            brokers: mock.bootstrap_servers(),
            tansu: false,
            mock: Some(mock),
        }
    }

    /// Creates the test's topic of `aggregate` with `partitions` (on the mock cluster, which
    /// has no CreateTopics, through the mock's own call, with 3 replicas).
    pub async fn create_topic(&self, aggregate: &str, partitions: i32) {
        self.create_topic_with(aggregate, partitions, 3).await;
    }

    /// [`TestKafka::create_topic`] with `replicas` on the mock cluster (elsewhere, the
    /// configuration's).
    pub async fn create_topic_with(&self, aggregate: &str, partitions: i32, replicas: i32) {
        match &self.mock {
            Some(mock) => mock
                .create_topic(&self.topic(aggregate), partitions, replicas)
                .expect("a topic on the mock cluster"),
            None => hexeract::kafka::ensure_topics(&self.config(partitions), &[aggregate])
                .await
                .expect("the test's topic"),
        }
    }

    /// Whether the brokers are tansu (not the mock cluster, and `TEST_KAFKA_IS_KAFKA` unset).
    pub fn is_tansu(&self) -> bool {
        self.tansu
    }

    /// The brokers' `bootstrap.servers`.
    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// The configuration of the test's prefix with `partitions` per topic: on the mock
    /// cluster, the default replication factor (3, as many as its brokers); elsewhere 1 (tansu
    /// and the Kafka of `compose.yaml` are single brokers).
    ///
    /// On tansu (unless `TEST_KAFKA_IS_KAFKA` is set) the producer sends one record per batch:
    /// tansu 0.6 answers a fetch at an offset inside a record batch with the batches after it,
    /// so a consumer resuming from a committed offset in the middle of a batch would never see
    /// the rest of that batch (Kafka returns the whole batch and the client skips what it
    /// already has).
    pub fn config(&self, partitions: i32) -> KafkaConfig {
        // A consumer that vanished (the abrupt stop of the restart test) hands its partitions
        // back after 6 s, not 45.
        let mut config = KafkaConfig::new(self.brokers.clone(), self.prefix.clone())
            .partitions(partitions)
            .consumer_option("session.timeout.ms", "6000")
            .consumer_option("heartbeat.interval.ms", "500");
        if self.tansu {
            config = config.client_option("batch.num.messages", "1");
        }
        if self.mock.is_none() {
            config = config.replication_factor(1);
        }
        match std::env::var("KAFKA_DEBUG") {
            Ok(debug) if !debug.is_empty() => config.client_option("debug", debug),
            _ => config,
        }
    }

    /// The test's topic of `aggregate`.
    pub fn topic(&self, aggregate: &str) -> String {
        format!("{}.{aggregate}", self.prefix)
    }

    /// Every record of `topic`, in partition then offset order: read from the start until
    /// `expected` records arrived and then nothing for half a second (watermarks are not used:
    /// tansu 0.6 answers 1 as every partition's end).
    pub fn read_all(&self, topic: &str, expected: usize) -> Vec<Record> {
        let consumer: BaseConsumer = client(&self.brokers)
            .set("group.id", format!("{}.reader", self.prefix))
            .set("enable.auto.commit", "false")
            .create()
            .expect("a Kafka consumer");
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("topic metadata");
        let mut list = TopicPartitionList::new();
        for partition in metadata.topics()[0].partitions() {
            list.add_partition_offset(topic, partition.id(), Offset::Beginning)
                .expect("partition");
        }
        consumer.assign(&list).expect("assign");
        let mut records = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut last_arrival = std::time::Instant::now();
        while std::time::Instant::now() < deadline {
            if records.len() >= expected && last_arrival.elapsed() > Duration::from_millis(500) {
                break;
            }
            let Some(message) = consumer.poll(Duration::from_millis(100)) else {
                continue;
            };
            let message = message.expect("a record");
            last_arrival = std::time::Instant::now();
            records.push(Record {
                partition: message.partition(),
                offset: message.offset(),
                key: message
                    .key()
                    .map(|key| String::from_utf8_lossy(key).into_owned()),
                headers: message
                    .headers()
                    .map(|headers| {
                        headers
                            .iter()
                            .map(|header| {
                                (
                                    header.key.to_owned(),
                                    String::from_utf8_lossy(header.value.unwrap_or_default())
                                        .into_owned(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                payload: message.payload().unwrap_or_default().to_vec(),
            });
        }
        records.sort_by_key(|record| (record.partition, record.offset));
        records
    }

    /// Sends one record to `topic` as another producer would: `headers` as given.
    pub async fn send_raw(
        &self,
        topic: &str,
        key: &str,
        headers: &[(&str, &str)],
        payload: &[u8],
    ) -> (i32, i64) {
        let producer: FutureProducer = client(&self.brokers).create().expect("a Kafka producer");
        let mut list = OwnedHeaders::new();
        for (name, value) in headers {
            list = list.insert(rdkafka::message::Header {
                key: name,
                value: Some(*value),
            });
        }
        let delivered = producer
            .send(
                FutureRecord::to(topic)
                    .key(key)
                    .payload(payload)
                    .headers(list),
                Duration::from_secs(10),
            )
            .await
            .unwrap_or_else(|(error, _)| panic!("sending a raw record to {topic}: {error}"));
        (delivered.partition, delivered.offset)
    }

    /// The offsets committed by `group` on `topic`'s partitions `0..partitions`: `None` where
    /// nothing is committed.
    pub fn committed(&self, group: &str, topic: &str, partitions: i32) -> Vec<Option<i64>> {
        let consumer: BaseConsumer = client(&self.brokers)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
            .expect("a Kafka consumer");
        let mut list = TopicPartitionList::new();
        for partition in 0..partitions {
            list.add_partition(topic, partition);
        }
        let committed = consumer
            .committed_offsets(list, Duration::from_secs(10))
            .expect("committed offsets");
        (0..partitions)
            .map(|partition| {
                committed
                    .find_partition(topic, partition)
                    .and_then(|element| element.offset().to_raw())
                    .filter(|offset| *offset >= 0)
            })
            .collect()
    }
}

fn client(brokers: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("log_level", "3");
    config
}
