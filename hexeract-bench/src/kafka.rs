//! Kafka: outbox → relay → Kafka → handler, against a hand-written rdkafka loop doing the same
//! work: the same outbox rows taken in `BEGIN IMMEDIATE` passes, produced with an idempotent
//! `acks=all` producer, deleted once acknowledged; consumed by a group that decodes each record,
//! calls the handler and stores its offset.
//!
//! The broker is `KAFKA_BROKERS` (default `127.0.0.1:9092`, the tansu `.ci/run` starts). Each
//! run has topics and groups of its own (`bench<uuid>`, 3 partitions); both sides pay for
//! joining their group inside the measured time.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, Utc};
use hexeract::kafka::{ensure_topics, KafkaConfig, KafkaRelay, KafkaWorker};
use hexeract::store::Store;
use hexeract::{CancellationToken, Context, Envelope, Handler, HandlerOptions, Message};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::{ClientConfig, Message as _};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection as _, Row};
use tokio::sync::Notify;
use uuid::Uuid;

/// Outbox rows per relay pass, on both sides.
const RELAY_BATCH: u32 = 100;
/// (hexeract, baseline) pairs.
const PAIRS: usize = 3;
const PARTITIONS: i32 = 3;
const HANDLER: &str = "bench.kafka_count";

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "bench.AccountCredited", aggregate = "account")]
struct AccountCredited {
    #[message(key)]
    account: u64,
    cents: i64,
    memo: String,
}

/// Where a run's records go: the broker at `KAFKA_BROKERS` (default `127.0.0.1:9092`), or a
/// librdkafka mock cluster in this process.
#[derive(Clone)]
pub(crate) struct Brokers {
    pub(crate) servers: String,
    /// Records per produce batch, on both sides: 1 on tansu (unless `KAFKA_IS_KAFKA` is set),
    /// which answers a fetch at an offset inside a batch with the batches after it, so that a
    /// fetch response cut inside a batch would lose the rest of it (`docs/kafka.md`);
    /// librdkafka's default (10 000) on Kafka and on the mock cluster.
    pub(crate) batch: &'static str,
    /// Creates a topic on the mock cluster, which has no CreateTopics.
    mock: Option<std::sync::mpsc::Sender<(String, std::sync::mpsc::Sender<()>)>>,
}

impl Brokers {
    pub(crate) fn configured() -> Brokers {
        let kafka = std::env::var("KAFKA_IS_KAFKA").is_ok_and(|value| !value.is_empty());
        Brokers {
            servers: std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_owned()),
            batch: if kafka { "10000" } else { "1" },
            mock: None,
        }
    }

    /// A mock cluster of 3 brokers, kept on a thread of its own for the life of the process.
    pub(crate) fn mock() -> Brokers {
        let (servers_to, servers) = std::sync::mpsc::channel();
        let (requests_to, requests) =
            std::sync::mpsc::channel::<(String, std::sync::mpsc::Sender<()>)>();
        std::thread::spawn(move || {
            let mock = rdkafka::mocking::MockCluster::new(3).expect("a mock cluster");
            servers_to.send(mock.bootstrap_servers()).expect("servers");
            for (topic, done) in requests {
                mock.create_topic(&topic, PARTITIONS, 3).expect("a topic");
                let _ = done.send(());
            }
        });
        Brokers {
            servers: servers.recv().expect("servers"),
            batch: "10000",
            mock: Some(requests_to),
        }
    }

    pub(crate) fn config(&self, prefix: &str) -> KafkaConfig {
        let config = KafkaConfig::new(self.servers.clone(), prefix)
            .partitions(PARTITIONS)
            .client_option("batch.num.messages", self.batch);
        match self.mock {
            // The mock cluster's 3 brokers hold the default 3 replicas.
            Some(_) => config,
            // tansu, or the one local Kafka of compose.yaml (`KAFKA_REPLICATION_FACTOR` for
            // a cluster of more).
            None => config.replication_factor(
                std::env::var("KAFKA_REPLICATION_FACTOR")
                    .ok()
                    .and_then(|factor| factor.parse().ok())
                    .unwrap_or(1),
            ),
        }
    }

    pub(crate) async fn create_topic(&self, prefix: &str) {
        match &self.mock {
            Some(requests) => {
                let (done_to, done) = std::sync::mpsc::channel();
                requests
                    .send((format!("{prefix}.account"), done_to))
                    .expect("the mock's thread");
                done.recv().expect("topic created");
            }
            None => ensure_topics(&self.config(prefix), &["account"])
                .await
                .expect("topics"),
        }
    }
}

fn envelopes(messages: u64) -> Vec<Envelope> {
    (0..messages)
        .map(|n| {
            Envelope::new(&AccountCredited {
                account: n % 100,
                cents: 1_250,
                memo: "monthly interest".into(),
            })
            .expect("encode")
        })
        .collect()
}

/// Counts handled messages and wakes the clock when all are in.
#[derive(Clone)]
struct Count {
    handled: Arc<AtomicU64>,
    target: u64,
    done: Arc<Notify>,
}

impl Count {
    fn new(target: u64) -> Count {
        Count {
            handled: Arc::new(AtomicU64::new(0)),
            target,
            done: Arc::new(Notify::new()),
        }
    }

    fn one(&self) {
        if self.handled.fetch_add(1, Ordering::AcqRel) + 1 == self.target {
            self.done.notify_one();
        }
    }
}

impl Handler<AccountCredited> for Count {
    type Error = std::convert::Infallible;
    async fn handle(&self, credit: AccountCredited, _ctx: &Context) -> Result<(), Self::Error> {
        black_box(&credit);
        self.one();
        Ok(())
    }
}

async fn run_hexeract(brokers: &Brokers, messages: &[Envelope]) -> Duration {
    let dir = crate::rabbitmq::TempDir::new();
    let store = crate::rabbitmq::filled_outbox(&dir, messages).await;
    let prefix = format!("bench{}", Uuid::now_v7().simple());
    let config = brokers.config(&prefix);
    brokers.create_topic(&prefix).await;
    let count = Count::new(messages.len() as u64);
    let store: Arc<dyn Store> = Arc::new(store);
    let worker = KafkaWorker::builder(config.clone(), store.clone())
        .register_handler_with::<AccountCredited, _>(
            count.clone(),
            HandlerOptions::new().name(HANDLER),
        )
        .build()
        .expect("worker");
    let relay = KafkaRelay::new(store, &config)
        .expect("relay")
        .batch_size(RELAY_BATCH);
    let cancel = CancellationToken::new();
    let started = Instant::now();
    let consuming = tokio::spawn(worker.run(cancel.clone()));
    let relaying = tokio::spawn(relay.run(cancel.clone()));
    let done = count.done.notified();
    if count.handled.load(Ordering::Acquire) < count.target {
        tokio::time::timeout(Duration::from_secs(300), done)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{} of {} messages handled after 300 s",
                    count.handled.load(Ordering::Acquire),
                    count.target
                )
            });
    }
    let elapsed = started.elapsed();
    cancel.cancel();
    consuming.await.expect("join").expect("worker");
    relaying.await.expect("join").expect("relay");
    elapsed
}

async fn run_raw(brokers: &Brokers, messages: &[Envelope]) -> Duration {
    let dir = crate::rabbitmq::TempDir::new();
    crate::rabbitmq::filled_outbox(&dir, messages)
        .await
        .pool()
        .close()
        .await;
    let prefix = format!("bench{}", Uuid::now_v7().simple());
    let topic = format!("{prefix}.account");
    brokers.create_topic(&prefix).await;
    let count = Count::new(messages.len() as u64);
    let started = Instant::now();
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers.servers)
        .set("group.id", format!("{prefix}.raw"))
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("consumer");
    consumer.subscribe(&[&topic]).expect("subscribe");
    let consuming = tokio::spawn({
        let count = count.clone();
        let topic = topic.clone();
        async move {
            while count.handled.load(Ordering::Acquire) < count.target {
                let record = consumer.recv().await.expect("a record");
                let typed = record
                    .headers()
                    .and_then(|headers| headers.iter().find(|h| h.key == "ce_type"))
                    .and_then(|header| header.value)
                    == Some(&b"bench.AccountCredited"[..]);
                if typed {
                    let credit: AccountCredited =
                        serde_json::from_slice(record.payload().unwrap_or_default())
                            .expect("decode");
                    black_box(&credit);
                    count.one();
                }
                let mut list = TopicPartitionList::with_capacity(1);
                list.add_partition_offset(
                    &topic,
                    record.partition(),
                    Offset::Offset(record.offset() + 1),
                )
                .expect("offset");
                consumer.store_offsets(&list).expect("store");
            }
        }
    });
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers.servers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "2")
        .set("batch.num.messages", brokers.batch)
        .create()
        .expect("producer");
    let mut db = SqliteConnectOptions::new()
        .filename(dir.database())
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(5))
        .disable_statement_logging()
        .connect()
        .await
        .expect("open");
    let take = "SELECT id, message_type, payload, headers, aggregate_key, created_at \
                FROM hexeract_outbox ORDER BY id LIMIT ?1";
    let delete = "DELETE FROM hexeract_outbox WHERE id IN (SELECT value FROM json_each(?1))";
    loop {
        let mut tx = db.begin_with("BEGIN IMMEDIATE").await.expect("begin");
        let rows = sqlx::query(take)
            .bind(i64::from(RELAY_BATCH))
            .fetch_all(&mut *tx)
            .await
            .expect("take");
        if rows.is_empty() {
            tx.rollback().await.expect("rollback");
            break;
        }
        let mut ids = Vec::with_capacity(rows.len());
        let mut pending = Vec::with_capacity(rows.len());
        for row in &rows {
            let id: String = row.get("id");
            let message_type: String = row.get("message_type");
            let payload: Vec<u8> = row.get("payload");
            let extra: BTreeMap<String, String> =
                serde_json::from_str(row.get::<&str, _>("headers")).expect("headers");
            let key: String = row.get("aggregate_key");
            let created_at: DateTime<Utc> = row.get("created_at");
            let time = created_at.to_rfc3339_opts(SecondsFormat::Millis, true);
            let mut headers = cloudevent_headers(&id, &message_type, &time);
            for (name, value) in &extra {
                headers = headers.insert(Header {
                    key: name,
                    value: Some(value),
                });
            }
            let record = FutureRecord::to(&topic)
                .key(&key)
                .payload(&payload)
                .headers(headers);
            pending.push(
                producer
                    .send_result(record)
                    .map_err(|(error, _)| error)
                    .expect("send"),
            );
            ids.push(id);
        }
        for delivery in pending {
            delivery.await.expect("delivery").expect("acknowledged");
        }
        sqlx::query(delete)
            .bind(serde_json::to_string(&ids).expect("ids"))
            .execute(&mut *tx)
            .await
            .expect("delete");
        tx.commit().await.expect("commit");
    }
    tokio::time::timeout(Duration::from_secs(300), consuming)
        .await
        .expect("every message handled within 300 s")
        .expect("join");
    let elapsed = started.elapsed();
    db.close().await.expect("close");
    elapsed
}

/// Prints the `kafka_relay_consume` lines (the broker of `KAFKA_BROKERS`, tansu under
/// `.ci/run`).
pub(crate) async fn relay_consume(messages: u64) {
    tokio::spawn(run("kafka_relay_consume", Brokers::configured(), messages))
        .await
        .expect("join");
}

/// Prints the `kafka_relay_consume_mock` lines: the same on a librdkafka mock cluster, with
/// librdkafka's default batching.
pub(crate) async fn relay_consume_mock(messages: u64) {
    tokio::spawn(run("kafka_relay_consume_mock", Brokers::mock(), messages))
        .await
        .expect("join");
}

async fn run(scenario: &str, brokers: Brokers, messages: u64) {
    let batch = envelopes(messages);
    let mut hexeract = Vec::new();
    let mut baseline = Vec::new();
    for pair in 0..PAIRS {
        for side in [pair % 2, 1 - pair % 2] {
            if side == 0 {
                hexeract.push(crate::rate(messages, run_hexeract(&brokers, &batch).await));
            } else {
                baseline.push(crate::rate(messages, run_raw(&brokers, &batch).await));
            }
        }
    }
    crate::rabbitmq::report(
        scenario,
        &hexeract,
        &baseline,
        messages,
        &format!(
            " batch={RELAY_BATCH} partitions={PARTITIONS} records_per_produce_batch={}",
            brokers.batch
        ),
    );
}

/// The record headers Hexeract writes (`docs/kafka.md`), written out by hand for the raw
/// producers: CloudEvents' binary mode and the content type.
pub(crate) fn cloudevent_headers(id: &str, message_type: &str, time: &str) -> OwnedHeaders {
    OwnedHeaders::new()
        .insert(Header {
            key: "ce_specversion",
            value: Some("1.0"),
        })
        .insert(Header {
            key: "ce_id",
            value: Some(id),
        })
        .insert(Header {
            key: "ce_type",
            value: Some(message_type),
        })
        .insert(Header {
            key: "ce_source",
            value: Some("/bench"),
        })
        .insert(Header {
            key: "ce_time",
            value: Some(time),
        })
        .insert(Header {
            key: "content-type",
            value: Some("application/json"),
        })
}
