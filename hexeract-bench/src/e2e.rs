//! End to end: the path a service runs, from a producer's committed transaction to the
//! handler, against a raw pipeline written by hand with the same guarantees, in the same run.
//!
//! - `e2e_pg_rabbitmq`: producers commit one event per PostgreSQL transaction (into the outbox,
//!   notifying in the same statement); a relay takes rows under `FOR UPDATE SKIP LOCKED`,
//!   publishes them persistent and confirmed to a quorum queue and deletes them once confirmed;
//!   a consumer (prefetch 16, manual acks) decodes each and calls the handler. Hexeract's side is
//!   `outbox::enqueue_envelopes` → [`RabbitMqRelay`] → [`RabbitMqWorker`](hexeract::rabbitmq::RabbitMqWorker);
//!   the raw side is sqlx and lapin: its own outbox table, `LISTEN`, a confirm window of 128,
//!   acks coalesced with `multiple` whenever no further delivery is ready.
//! - `e2e_pg_kafka` (librdkafka's mock cluster in the process) and `e2e_pg_kafka_tansu` (the
//!   broker of `KAFKA_BROKERS`; not in `--quick`): the same producers and outbox, relayed to an
//!   aggregate's topic (3 partitions, idempotent producer, `acks=all`, rows deleted once
//!   acknowledged); Hexeract's [`KafkaRelay`](hexeract::kafka::KafkaRelay) and
//!   [`KafkaWorker`](hexeract::kafka::KafkaWorker) against rdkafka by hand: a relay of the same
//!   shape and a consumer group that decodes each record, calls the handler and stores its
//!   offset. A consumer group joins in about 3 s, so these runs give their pipeline 4 s to
//!   start; their latency is mostly the consumers' fetch wait, the same on both sides.
//! - `e2e_sqlite`: the embedded default: producers `publish` one event per transaction into a
//!   SQLite file (WAL, `synchronous=NORMAL`); Hexeract's outbox worker calls the handler and
//!   settles each delivery; the raw side reads the oldest rows, calls the handler, deletes them
//!   (one consumer, so no claim).
//!
//! Each prints its throughput at full offered load (every producer committing as fast as it
//! can; the clock runs from the first commit until the handler saw the last message), then the
//! commit→handler latency at two fixed offered loads, half and nine tenths of the raw
//! pipeline's throughput just measured, open loop (each event is committed at its time
//! whatever the pipeline does):
//!
//! ```text
//! scenario=e2e_pg_rabbitmq hexeract=<msgs/s> baseline=<msgs/s> ratio=<h/b> producers=8 …
//! scenario=e2e_pg_rabbitmq_latency load=0.5 offered=<msgs/s> hexeract_p50_ms=… hexeract_p99_ms=… hexeract_max_ms=… baseline_p50_ms=… …
//! ```
//!
//! Latency is from the moment the producer's `COMMIT` returned to the moment the handler was
//! called. Every run has a schema, a database file and broker objects of its own.

use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{FutureExt, StreamExt};
use hexeract::outbox::OutboxWorker;
use hexeract::rabbitmq::{RabbitMqRelay, RabbitMqWorkerBuilder};
use hexeract::store::postgres::PgStore;
use hexeract::store::sqlite::SqliteStore;
use hexeract::store::DeliveryStore;
use hexeract::{CancellationToken, Context, Envelope, Handler, HandlerOptions, Message, Registry};
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use sqlx::postgres::{PgListener, PgPoolOptions, PgRow};
use sqlx::sqlite::SqliteSynchronous;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::{ConnectOptions, PgPool, Row};
use tokio::sync::Notify;
use uuid::Uuid;

use crate::rabbitmq::{self, Place, Window};

/// Concurrent producers, each committing one event per transaction.
const PRODUCERS: usize = 8;
/// Producers on SQLite, which has one writer at a time.
const SQLITE_PRODUCERS: usize = 2;
/// Outbox rows per relay pass (both sides).
const RELAY_BATCH: u32 = 100;
/// The consumers' prefetch (both sides): the worker's default.
const PREFETCH: u16 = 16;
/// Deliveries the SQLite worker claims per cycle, and rows the raw loop reads per pass.
const SQLITE_BATCH: u32 = 100;
/// How long a pipeline is given to start before the first event.
const SETTLE: Duration = Duration::from_millis(200);
/// The same with a Kafka consumer group to join (about 3 s on the mock cluster).
const KAFKA_SETTLE: Duration = Duration::from_secs(4);
/// Offered loads, as shares of the raw pipeline's throughput.
const LOADS: [f64; 2] = [0.5, 0.9];
/// (hexeract, baseline) pairs of the throughput runs.
const PAIRS: usize = 3;
const HANDLER: &str = "bench.e2e";
/// The payload's size in bytes, as JSON.
const PAYLOAD: usize = 200;

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "bench.e2e.OrderPlaced")]
struct OrderPlaced {
    seq: u64,
    customer: String,
    total_cents: i64,
    /// Padding to the payload's size.
    note: String,
}

fn order(seq: u64) -> OrderPlaced {
    let mut order = OrderPlaced {
        seq,
        customer: "customer-0042".into(),
        total_cents: 12_990,
        note: String::new(),
    };
    let bare = serde_json::to_vec(&order).expect("encode").len();
    order.note = "x".repeat(PAYLOAD.saturating_sub(bare));
    order
}

/// When each event was committed and first handled, in nanoseconds from `base` (0: not yet).
struct Clock {
    base: Instant,
    committed: Box<[AtomicU64]>,
    arrived: Box<[AtomicU64]>,
    handled: AtomicU64,
    done: Notify,
}

impl Clock {
    fn new(messages: u64) -> Arc<Clock> {
        let slots = || (0..messages).map(|_| AtomicU64::new(0)).collect();
        Arc::new(Clock {
            base: Instant::now(),
            committed: slots(),
            arrived: slots(),
            handled: AtomicU64::new(0),
            done: Notify::new(),
        })
    }

    fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX) + 1
    }

    fn committed(&self, seq: u64) {
        self.committed[seq as usize].store(self.now(), Ordering::Relaxed);
    }

    /// The handler saw `seq`; counts it the first time only.
    fn arrived(&self, seq: u64) {
        let Some(slot) = self.arrived.get(seq as usize) else {
            return;
        };
        if slot
            .compare_exchange(0, self.now(), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
            && self.handled.fetch_add(1, Ordering::SeqCst) + 1 == self.arrived.len() as u64
        {
            self.done.notify_one();
        }
    }

    /// Waits until every event was handled.
    async fn all_handled(&self) {
        let notified = self.done.notified();
        if self.handled.load(Ordering::SeqCst) == self.arrived.len() as u64 {
            return;
        }
        tokio::time::timeout(Duration::from_secs(120), notified)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "end to end: {} of {} events handled after 120 s",
                    self.handled.load(Ordering::SeqCst),
                    self.arrived.len()
                )
            });
    }

    /// From the first commit to the last arrival.
    fn span(&self) -> Duration {
        let first = self
            .committed
            .iter()
            .map(|at| at.load(Ordering::Relaxed))
            .min();
        let last = self
            .arrived
            .iter()
            .map(|at| at.load(Ordering::Relaxed))
            .max();
        Duration::from_nanos(last.unwrap_or(0).saturating_sub(first.unwrap_or(0)))
    }

    /// Commit→handler latencies, sorted. An event handled before its producer heard that the
    /// commit succeeded counts as 0.
    fn latencies(&self) -> Vec<Duration> {
        let mut latencies: Vec<Duration> = self
            .committed
            .iter()
            .zip(self.arrived.iter())
            .map(|(committed, arrived)| {
                Duration::from_nanos(
                    arrived
                        .load(Ordering::Relaxed)
                        .saturating_sub(committed.load(Ordering::Relaxed)),
                )
            })
            .collect();
        latencies.sort();
        latencies
    }
}

/// The handler, on both sides: decodes (done before it is called), records the arrival.
struct Record(Arc<Clock>);

impl Handler<OrderPlaced> for Record {
    type Error = std::convert::Infallible;
    async fn handle(&self, order: OrderPlaced, _ctx: &Context) -> Result<(), Self::Error> {
        self.0.arrived(order.seq);
        black_box(&order);
        Ok(())
    }
}

type Commit = Arc<dyn Fn(u64) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Commits every event with `producers` tasks, each taking the next sequence number; at
/// `rate` events per second when given (event `n` not before `n / rate` seconds after the
/// start), as fast as they can otherwise.
async fn produce(clock: &Arc<Clock>, producers: usize, rate: Option<f64>, commit: Commit) {
    let messages = clock.committed.len() as u64;
    let next = Arc::new(AtomicU64::new(0));
    let started = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..producers)
        .map(|_| {
            let (clock, next, commit) = (clock.clone(), next.clone(), commit.clone());
            tokio::spawn(async move {
                loop {
                    let seq = next.fetch_add(1, Ordering::Relaxed);
                    if seq >= messages {
                        break;
                    }
                    if let Some(rate) = rate {
                        tokio::time::sleep_until(
                            started + Duration::from_secs_f64(seq as f64 / rate),
                        )
                        .await;
                    }
                    commit(seq).await;
                    clock.committed(seq);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("producer");
    }
}

/// A running pipeline: its producer's commit, and what stops and cleans it up.
struct Pipeline {
    commit: Commit,
    stop: Pin<Box<dyn Future<Output = ()> + Send>>,
}

/// Which side runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Hexeract,
    Raw,
}

/// One run of a pipeline: `messages` events at `rate` (or flat out); the clock it filled.
async fn run_once<F, P>(
    start: &F,
    side: Side,
    messages: u64,
    producers: usize,
    rate: Option<f64>,
    settle: Duration,
) -> (Arc<Clock>, Duration)
where
    F: Fn(Side, Arc<Clock>) -> P,
    P: Future<Output = Pipeline>,
{
    let clock = Clock::new(messages);
    let pipeline = start(side, clock.clone()).await;
    // Let consumers attach (a Kafka consumer group join) and the relay go idle, as in a
    // service between events.
    tokio::time::sleep(settle).await;
    let used = crate::cpu::this_process();
    produce(&clock, producers, rate, pipeline.commit).await;
    clock.all_handled().await;
    let cpu = crate::cpu::this_process().saturating_sub(used);
    pipeline.stop.await;
    (clock, cpu)
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1_000.0
}

/// p50, p99 and max of sorted latencies, in milliseconds.
fn quantiles(latencies: &[Duration]) -> [f64; 3] {
    let at = |quantile: f64| {
        let index =
            ((latencies.len() as f64 * quantile).ceil() as usize).clamp(1, latencies.len()) - 1;
        millis(latencies[index])
    };
    [at(0.50), at(0.99), millis(latencies[latencies.len() - 1])]
}

/// How a pipeline runs: its producers, how long it is left to settle before the first commit,
/// and whether all of it runs in this process (then each side's processor time per message is
/// printed).
#[derive(Clone, Copy)]
struct Shape {
    producers: usize,
    settle: Duration,
    in_process: bool,
}

/// Throughput pairs, then latency at each load: the lines of `scenario`.
async fn measure<F, P>(
    scenario: &str,
    start: F,
    messages: u64,
    shape: Shape,
    settings: &str,
    quick: bool,
) where
    F: Fn(Side, Arc<Clock>) -> P,
    P: Future<Output = Pipeline>,
{
    let Shape {
        producers,
        settle,
        in_process,
    } = shape;
    let mut hexeract = Vec::new();
    let mut baseline = Vec::new();
    // Per side, the processor time the process used from the first commit until the handler
    // saw the last message, and that time: the whole pipeline's where it runs in the process
    // (SQLite).
    let mut cpu = [Duration::ZERO; 2];
    let mut wall = [Duration::ZERO; 2];
    for pair in 0..PAIRS {
        for side in [pair % 2, 1 - pair % 2] {
            let (clock, used) = if side == 0 {
                run_once(&start, Side::Hexeract, messages, producers, None, settle).await
            } else {
                run_once(&start, Side::Raw, messages, producers, None, settle).await
            };
            let rates = if side == 0 {
                &mut hexeract
            } else {
                &mut baseline
            };
            rates.push(crate::rate(messages, clock.span()));
            cpu[side] += used;
            wall[side] += clock.span();
        }
    }
    let cpu_settings = if in_process {
        let per_message = |side: usize| crate::cpu::per_message(cpu[side], messages * PAIRS as u64);
        let busy = |side: usize| cpu[side].as_secs_f64() / wall[side].as_secs_f64();
        format!(
            " hexeract_cpu_us_per_msg={:.1} baseline_cpu_us_per_msg={:.1} \
             hexeract_cores_busy={:.2} baseline_cores_busy={:.2}",
            per_message(0),
            per_message(1),
            busy(0),
            busy(1)
        )
    } else {
        String::new()
    };
    rabbitmq::report(
        scenario,
        &hexeract,
        &baseline,
        messages,
        &format!(" producers={producers} payload_bytes={PAYLOAD}{settings}{cpu_settings}"),
    );
    let mut sorted = baseline.clone();
    sorted.sort_by(f64::total_cmp);
    let raw_max = sorted[sorted.len() / 2];
    let seconds = if quick { 2.0 } else { 10.0 };
    for load in LOADS {
        let offered = raw_max * load;
        let samples = ((offered * seconds) as u64).max(100);
        let mut line = format!("scenario={scenario}_latency load={load} offered={offered:.0}");
        for (side, name) in [(Side::Hexeract, "hexeract"), (Side::Raw, "baseline")] {
            let (clock, _) =
                run_once(&start, side, samples, producers, Some(offered), settle).await;
            let [p50, p99, max] = quantiles(&clock.latencies());
            line.push_str(&format!(
                " {name}_p50_ms={p50:.2} {name}_p99_ms={p99:.2} {name}_max_ms={max:.2}"
            ));
        }
        println!("{line} samples={samples}");
    }
}

// ---------------------------------------------------------------------------------------------
// The PostgreSQL sides

/// The producers' commit on Hexeract's side: `event(seq)` enqueued in a transaction of its own
/// into the outbox of `schema` (which notifies the relay at commit).
fn enqueue_commit(producers: PgPool, schema: String, event: fn(u64) -> Envelope) -> Commit {
    Arc::new(move |seq| {
        let (producers, schema) = (producers.clone(), schema.clone());
        Box::pin(async move {
            let mut tx = producers.begin().await.expect("begin");
            hexeract::outbox::enqueue_envelopes(&mut tx, &schema, &[event(seq)])
                .await
                .expect("enqueue");
            tx.commit().await.expect("commit");
        })
    })
}

/// A raw relay's broker side.
trait RawPublish: Send {
    /// Publishes `rows`, returning once the broker has every one.
    fn publish(&mut self, rows: &[PgRow]) -> impl Future<Output = ()> + Send;
}

/// Persistent and confirmed, at most 128 confirms outstanding, as the relay publishes.
struct ToRabbitMq {
    channel: lapin::Channel,
    exchange: String,
}

impl RawPublish for ToRabbitMq {
    async fn publish(&mut self, rows: &[PgRow]) {
        let empty = std::collections::BTreeMap::new();
        let mut window = Window::new(&self.channel);
        for row in rows {
            let message_id: Uuid = row.get("message_id");
            let message_type: String = row.get("message_type");
            let payload: Vec<u8> = row.get("payload");
            let properties = rabbitmq::properties(
                &message_id.to_string(),
                &message_type,
                row.get("created_at"),
                &empty,
            );
            window
                .publish(&self.exchange, &message_type, &payload, properties)
                .await;
        }
        window.settle().await;
    }
}

/// Idempotent, `acks=all`, every acknowledgement awaited, with the headers Hexeract writes.
struct ToKafka {
    producer: rdkafka::producer::FutureProducer,
    topic: String,
}

impl RawPublish for ToKafka {
    async fn publish(&mut self, rows: &[PgRow]) {
        let mut pending = Vec::with_capacity(rows.len());
        for row in rows {
            let id = row.get::<Uuid, _>("message_id").to_string();
            let message_type: String = row.get("message_type");
            let key: String = row.get("key");
            let payload: Vec<u8> = row.get("payload");
            let created_at: chrono::DateTime<chrono::Utc> = row.get("created_at");
            let time = created_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            let record = rdkafka::producer::FutureRecord::to(&self.topic)
                .key(&key)
                .payload(&payload)
                .headers(crate::kafka::cloudevent_headers(&id, &message_type, &time));
            pending.push(
                self.producer
                    .send_result(record)
                    .map_err(|(error, _)| error)
                    .expect("send"),
            );
        }
        for delivery in pending {
            delivery.await.expect("delivery").expect("acknowledged");
        }
    }
}

/// What a raw producer writes: a row of the raw outbox.
struct RawEvent {
    message_type: &'static str,
    payload: Vec<u8>,
    /// The record key, on the Kafka pipeline.
    key: Option<String>,
}

/// A raw pipeline's outbox: a schema of its own with one table, and the `NOTIFY` channel its
/// producers signal at commit.
struct RawOutbox {
    pool: PgPool,
    schema: String,
    channel: String,
}

impl RawOutbox {
    /// Creates the table; `key` adds a `key` column (Kafka's record key).
    async fn create(key: bool) -> RawOutbox {
        let pool = crate::outbox::connect().await;
        let schema = format!("bench_e2e_raw_{}", Uuid::now_v7().simple());
        let key = if key { "key text NOT NULL," } else { "" };
        sqlx::raw_sql(&format!(
            "CREATE SCHEMA {schema};
             CREATE TABLE {schema}.outbox (
                 id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                 message_id uuid NOT NULL,
                 message_type text NOT NULL,
                 {key}
                 payload bytea NOT NULL,
                 created_at timestamptz NOT NULL DEFAULT now()
             );"
        ))
        .execute(&pool)
        .await
        .expect("raw outbox");
        RawOutbox {
            pool,
            schema,
            channel: format!("bench_e2e_{}", Uuid::now_v7().simple()),
        }
    }

    /// The producers' commit: `event(seq)` written in a transaction of its own, the channel
    /// notified in the same statement (PostgreSQL delivers it at commit).
    fn commit(&self, producers: PgPool, event: fn(u64) -> RawEvent) -> Commit {
        let insert = format!(
            "WITH inserted AS (
                 INSERT INTO {}.outbox (message_id, message_type, payload{})
                 VALUES ($1, $2, $3{})
             )
             SELECT pg_notify($4, '')",
            self.schema,
            if event(0).key.is_some() { ", key" } else { "" },
            if event(0).key.is_some() { ", $5" } else { "" },
        );
        let channel = self.channel.clone();
        Arc::new(move |seq| {
            let (producers, insert, channel) = (producers.clone(), insert.clone(), channel.clone());
            Box::pin(async move {
                let event = event(seq);
                let mut tx = producers.begin().await.expect("begin");
                let mut query = sqlx::query(&insert)
                    .bind(Uuid::now_v7())
                    .bind(event.message_type)
                    .bind(event.payload)
                    .bind(&channel);
                if let Some(key) = event.key {
                    query = query.bind(key);
                }
                query.execute(&mut *tx).await.expect("insert");
                tx.commit().await.expect("commit");
            })
        })
    }

    /// The relay, until `cancel`: in a transaction, take the oldest rows (`FOR UPDATE SKIP
    /// LOCKED`), `publish` them (it returns once the broker has every one), delete them,
    /// commit; when there are none, wait for a notification (or 100 ms).
    async fn relay(&self, cancel: CancellationToken, mut publisher: impl RawPublish) {
        let mut listener = PgListener::connect_with(&self.pool).await.expect("listen");
        listener.listen(&self.channel).await.expect("listen");
        let take = format!(
            "SELECT * FROM {}.outbox ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
            self.schema
        );
        let delete = format!("DELETE FROM {}.outbox WHERE id = ANY($1)", self.schema);
        while !cancel.is_cancelled() {
            let mut tx = self.pool.begin().await.expect("begin");
            let rows = sqlx::query(&take)
                .bind(i64::from(RELAY_BATCH))
                .fetch_all(&mut *tx)
                .await
                .expect("take");
            if rows.is_empty() {
                tx.commit().await.expect("commit");
                tokio::select! {
                    _ = listener.recv() => {}
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    () = cancel.cancelled() => {}
                }
                continue;
            }
            publisher.publish(&rows).await;
            let ids: Vec<i64> = rows.iter().map(|row| row.get("id")).collect();
            sqlx::query(&delete)
                .bind(&ids)
                .execute(&mut *tx)
                .await
                .expect("delete");
            tx.commit().await.expect("commit");
        }
    }

    async fn drop(self) {
        sqlx::query(&format!("DROP SCHEMA {} CASCADE", self.schema))
            .execute(&self.pool)
            .await
            .expect("drop schema");
        self.pool.close().await;
    }
}

// ---------------------------------------------------------------------------------------------
// e2e_pg_rabbitmq

/// Prints the `e2e_pg_rabbitmq` lines.
pub(crate) async fn pg_rabbitmq(messages: u64, quick: bool) {
    // On a runtime worker, as the relay's and the worker's tasks are.
    tokio::spawn(async move {
        let producers = producer_pool(PRODUCERS).await;
        let settings =
            format!(" relay_batch={RELAY_BATCH} prefetch={PREFETCH} queue=quorum confirms=on");
        measure(
            "e2e_pg_rabbitmq",
            |side, clock| pg_rabbitmq_pipeline(side, clock, producers.clone()),
            messages,
            Shape {
                producers: PRODUCERS,
                settle: SETTLE,
                in_process: false,
            },
            &settings,
            quick,
        )
        .await;
    })
    .await
    .expect("join");
}

/// The producers' own pool: one connection each.
async fn producer_pool(size: usize) -> PgPool {
    let url = std::env::var("BENCH_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let options: sqlx::postgres::PgConnectOptions = url
        .parse()
        .expect("BENCH_DATABASE_URL is a postgres:// URL");
    PgPoolOptions::new()
        .max_connections(size as u32)
        .min_connections(size as u32)
        .connect_with(
            options
                .application_name("hexeract-bench-producer")
                .disable_statement_logging(),
        )
        .await
        .unwrap_or_else(|error| {
            panic!("cannot reach PostgreSQL ({error}); start it or set BENCH_DATABASE_URL")
        })
}

async fn pg_rabbitmq_pipeline(side: Side, clock: Arc<Clock>, producers: PgPool) -> Pipeline {
    match side {
        Side::Hexeract => pg_rabbitmq_hexeract(clock, producers).await,
        Side::Raw => pg_rabbitmq_raw(clock, producers).await,
    }
}

fn registry_topology(prefix: &str) -> hexeract::rabbitmq::Topology {
    let mut registry = Registry::new();
    registry
        .register::<OrderPlaced, _>(Record(Clock::new(0)), HandlerOptions::new().name(HANDLER))
        .expect("register");
    hexeract::rabbitmq::Topology::from_registry(&registry)
        .exchange(prefix)
        .prefix(prefix)
}

async fn pg_rabbitmq_hexeract(clock: Arc<Clock>, producers: PgPool) -> Pipeline {
    let pool = crate::outbox::connect().await;
    let schema = format!("bench_e2e_{}", Uuid::now_v7().simple());
    let store = PgStore::new(pool.clone(), &schema).expect("schema name");
    store.migrate().await.expect("migrate");
    let setup = rabbitmq::connect("e2e-setup").await;
    let worker_connection = rabbitmq::connect("e2e-worker").await;
    let relay_connection = rabbitmq::connect("e2e-relay").await;
    let prefix = format!("bench.e2e.{}", Uuid::now_v7().simple());
    let worker = RabbitMqWorkerBuilder::new(worker_connection.clone())
        .registry(Registry::new())
        .register_handler_with::<OrderPlaced, _>(Record(clock), HandlerOptions::new().name(HANDLER))
        .exchange(&prefix)
        .prefix(&prefix)
        .prefetch(u32::from(PREFETCH))
        .park_without_rows()
        .build()
        .expect("worker");
    let place = Place::whole(worker.topology());
    place.declare(&setup).await;
    let relay = RabbitMqRelay::new(Arc::new(store.clone()), &relay_connection)
        .await
        .expect("relay")
        .exchange(&prefix)
        .batch_size(RELAY_BATCH);
    let cancel = CancellationToken::new();
    let worker = tokio::spawn(worker.run(cancel.child_token()));
    let relay = tokio::spawn(relay.run(cancel.child_token()));
    let commit = enqueue_commit(producers, schema, |seq| {
        Envelope::new(&order(seq)).expect("encode")
    });
    let stop = Box::pin(async move {
        cancel.cancel();
        worker.await.expect("join").expect("worker");
        relay.await.expect("join").expect("relay");
        place.delete(&setup).await;
        crate::outbox::drop_schema(&pool, &store).await;
        pool.close().await;
        let _ = worker_connection.close().await;
        let _ = relay_connection.close().await;
        let _ = setup.close().await;
    });
    Pipeline { commit, stop }
}

async fn pg_rabbitmq_raw(clock: Arc<Clock>, producers: PgPool) -> Pipeline {
    let outbox = Arc::new(RawOutbox::create(false).await);
    let setup = rabbitmq::connect("e2e-raw-setup").await;
    let place = Place::handler_queue_of(
        &registry_topology(&format!("bench.e2e.raw.{}", Uuid::now_v7().simple())),
        HANDLER,
    );
    place.declare(&setup).await;
    let cancel = CancellationToken::new();

    // The relay: each batch published persistent with confirms, at most 128 outstanding.
    let relay = {
        let (outbox, exchange, cancel) = (outbox.clone(), place.exchange.clone(), cancel.clone());
        let connection = rabbitmq::connect_raw("e2e-raw-relay").await;
        tokio::spawn(async move {
            let channel = rabbitmq::confirm_channel(&connection).await;
            let publisher = ToRabbitMq {
                channel: channel.clone(),
                exchange,
            };
            outbox.relay(cancel, publisher).await;
            let _ = channel.close(200, "relay stopped".into()).await;
            let _ = connection.close(200, "relay stopped".into()).await;
        })
    };

    // The consumer: prefetch 16, decode, call, ack with `multiple` when nothing else is ready.
    let consumer = {
        let (queue, cancel) = (place.queue.clone(), cancel.clone());
        let connection = rabbitmq::connect_raw("e2e-raw-consumer").await;
        let channel = connection.create_channel().await.expect("channel");
        channel
            .basic_qos(PREFETCH, BasicQosOptions { global: false })
            .await
            .expect("basic.qos");
        let mut deliveries = channel
            .basic_consume(
                queue.as_str().into(),
                format!("hexeract-bench:{}", Uuid::now_v7().simple()).into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("basic.consume");
        let handler = Record(clock);
        tokio::spawn(async move {
            let ack_every = u64::from(PREFETCH / 2);
            let mut unacked = 0u64;
            let mut last_tag = 0;
            let context = Context::new(
                Envelope::new(&order(0)).expect("encode"),
                HANDLER,
                CancellationToken::new(),
                Arc::new(hexeract::InMemoryStore::new()),
            );
            loop {
                let next = match deliveries.next().now_or_never() {
                    Some(next) => next,
                    None => {
                        if unacked > 0 {
                            channel
                                .basic_ack(last_tag, BasicAckOptions { multiple: true })
                                .await
                                .expect("ack");
                            unacked = 0;
                        }
                        tokio::select! {
                            next = deliveries.next() => next,
                            () = cancel.cancelled() => break,
                        }
                    }
                };
                let delivery = next.expect("the consumer ended").expect("delivery");
                let order: OrderPlaced = serde_json::from_slice(&delivery.data).expect("decode");
                handler.handle(order, &context).await.expect("infallible");
                unacked += 1;
                last_tag = delivery.delivery_tag;
                if unacked >= ack_every {
                    channel
                        .basic_ack(last_tag, BasicAckOptions { multiple: true })
                        .await
                        .expect("ack");
                    unacked = 0;
                }
            }
            let _ = channel.close(200, "consumer stopped".into()).await;
            let _ = connection.close(200, "consumer stopped".into()).await;
        })
    };

    let commit = outbox.commit(producers, |seq| RawEvent {
        message_type: OrderPlaced::MESSAGE_TYPE,
        payload: serde_json::to_vec(&order(seq)).expect("encode"),
        key: None,
    });
    let stop = Box::pin(async move {
        cancel.cancel();
        relay.await.expect("relay");
        consumer.await.expect("consumer");
        place.delete(&setup).await;
        Arc::into_inner(outbox)
            .expect("the relay ended")
            .drop()
            .await;
        let _ = setup.close().await;
    });
    Pipeline { commit, stop }
}

// ---------------------------------------------------------------------------------------------
// e2e_sqlite

/// Prints the `e2e_sqlite` lines.
pub(crate) async fn sqlite(messages: u64, quick: bool) {
    tokio::spawn(async move {
        measure(
            "e2e_sqlite",
            sqlite_pipeline,
            messages,
            Shape {
                producers: SQLITE_PRODUCERS,
                settle: SETTLE,
                in_process: true,
            },
            &format!(" batch={SQLITE_BATCH} journal=wal synchronous=normal"),
            quick,
        )
        .await;
    })
    .await
    .expect("join");
}

async fn sqlite_pipeline(side: Side, clock: Arc<Clock>) -> Pipeline {
    match side {
        Side::Hexeract => sqlite_hexeract(clock).await,
        Side::Raw => sqlite_raw(clock).await,
    }
}

async fn sqlite_hexeract(clock: Arc<Clock>) -> Pipeline {
    let dir = rabbitmq::TempDir::new();
    let store = SqliteStore::open(dir.database()).await.expect("open");
    store.migrate().await.expect("migrate");
    let worker = OutboxWorker::builder(store.clone())
        .registry(Registry::new())
        .register_handler_with::<OrderPlaced, _>(Record(clock), HandlerOptions::new().name(HANDLER))
        .batch_size(SQLITE_BATCH)
        .build()
        .expect("worker");
    let cancel = CancellationToken::new();
    let worker = tokio::spawn(worker.run(cancel.clone()));
    let publisher = store.clone();
    let commit: Commit = Arc::new(move |seq| {
        let store = publisher.clone();
        Box::pin(async move {
            let envelope = Envelope::new(&order(seq)).expect("encode");
            store.publish(vec![envelope]).await.expect("publish");
        })
    });
    let stop = Box::pin(async move {
        cancel.cancel();
        worker.await.expect("join").expect("worker");
        store.pool().close().await;
        drop(dir);
    });
    Pipeline { commit, stop }
}

async fn sqlite_raw(clock: Arc<Clock>) -> Pipeline {
    let dir = rabbitmq::TempDir::new();
    let options = SqliteConnectOptions::new()
        .filename(dir.database())
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(5))
        .disable_statement_logging();
    // The store's pool settings: 10 connections, no liveness ping before each acquire (a
    // round trip to the connection's thread that a file never needs).
    let pool: SqlitePool = SqlitePoolOptions::new()
        .max_connections(10)
        .test_before_acquire(false)
        .connect_with(options)
        .await
        .expect("open");
    sqlx::query(
        "CREATE TABLE outbox (
             id INTEGER PRIMARY KEY AUTOINCREMENT,
             message_id TEXT NOT NULL,
             message_type TEXT NOT NULL,
             payload BLOB NOT NULL,
             created_at TEXT NOT NULL
         )",
    )
    .execute(&pool)
    .await
    .expect("create");
    let wake = Arc::new(Notify::new());
    let cancel = CancellationToken::new();
    let consumer = {
        let (pool, wake, cancel) = (pool.clone(), wake.clone(), cancel.clone());
        tokio::spawn(async move {
            let handler = Record(clock);
            let context = Context::new(
                Envelope::new(&order(0)).expect("encode"),
                HANDLER,
                CancellationToken::new(),
                Arc::new(hexeract::InMemoryStore::new()),
            );
            while !cancel.is_cancelled() {
                let rows = sqlx::query("SELECT id, payload FROM outbox ORDER BY id LIMIT ?1")
                    .bind(i64::from(SQLITE_BATCH))
                    .fetch_all(&pool)
                    .await
                    .expect("take");
                if rows.is_empty() {
                    tokio::select! {
                        () = wake.notified() => {}
                        () = tokio::time::sleep(Duration::from_millis(100)) => {}
                        () = cancel.cancelled() => {}
                    }
                    continue;
                }
                let mut ids = Vec::with_capacity(rows.len());
                for row in &rows {
                    let payload: Vec<u8> = row.get("payload");
                    let order: OrderPlaced = serde_json::from_slice(&payload).expect("decode");
                    handler.handle(order, &context).await.expect("infallible");
                    ids.push(row.get::<i64, _>("id"));
                }
                sqlx::query("DELETE FROM outbox WHERE id IN (SELECT value FROM json_each(?1))")
                    .bind(serde_json::to_string(&ids).expect("ids"))
                    .execute(&pool)
                    .await
                    .expect("delete");
            }
        })
    };
    let producer_pool = pool.clone();
    let commit: Commit = Arc::new(move |seq| {
        let (pool, wake) = (producer_pool.clone(), wake.clone());
        Box::pin(async move {
            // One statement, its own transaction, as `publish` writes.
            sqlx::query(
                "INSERT INTO outbox (message_id, message_type, payload, created_at)
                 VALUES (?1, ?2, ?3, ?4)",
            )
            .bind(Uuid::now_v7().to_string())
            .bind(OrderPlaced::MESSAGE_TYPE)
            .bind(serde_json::to_vec(&order(seq)).expect("encode"))
            .bind(chrono::Utc::now().to_rfc3339())
            .execute(&pool)
            .await
            .expect("insert");
            wake.notify_one();
        })
    });
    let stop = Box::pin(async move {
        cancel.cancel();
        consumer.await.expect("consumer");
        pool.close().await;
        drop(dir);
    });
    Pipeline { commit, stop }
}

// ---------------------------------------------------------------------------------------------
// e2e_pg_kafka

/// The Kafka pipeline's event: an aggregate's, so that it has a topic (`<prefix>.account`) and
/// a key.
#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "bench.e2e.AccountCredited", aggregate = "account")]
struct AccountCredited {
    #[message(key)]
    account: u64,
    seq: u64,
    /// Padding to the payload's size.
    note: String,
}

fn credit(seq: u64) -> AccountCredited {
    let mut credit = AccountCredited {
        account: seq % 100,
        seq,
        note: String::new(),
    };
    let bare = serde_json::to_vec(&credit).expect("encode").len();
    credit.note = "x".repeat(PAYLOAD.saturating_sub(bare));
    credit
}

impl Handler<AccountCredited> for Record {
    type Error = std::convert::Infallible;
    async fn handle(&self, credit: AccountCredited, _ctx: &Context) -> Result<(), Self::Error> {
        self.0.arrived(credit.seq);
        black_box(&credit);
        Ok(())
    }
}

/// Prints the `e2e_pg_kafka` lines: on librdkafka's mock cluster in this process with
/// `mock`, else on the broker of `KAFKA_BROKERS` (`e2e_pg_kafka_tansu`: tansu, where `.ci/run` has
/// started it; not in `--quick`).
pub(crate) async fn pg_kafka(messages: u64, quick: bool, mock: bool) {
    tokio::spawn(async move {
        let (scenario, brokers) = if mock {
            ("e2e_pg_kafka", crate::kafka::Brokers::mock())
        } else {
            ("e2e_pg_kafka_tansu", crate::kafka::Brokers::configured())
        };
        let producers = producer_pool(PRODUCERS).await;
        let settings = format!(
            " relay_batch={RELAY_BATCH} partitions=3 acks=all idempotent=on batch_num_messages={}",
            brokers.batch
        );
        measure(
            scenario,
            |side, clock| pg_kafka_pipeline(side, clock, producers.clone(), brokers.clone()),
            messages,
            Shape {
                producers: PRODUCERS,
                settle: KAFKA_SETTLE,
                in_process: false,
            },
            &settings,
            quick,
        )
        .await;
    })
    .await
    .expect("join");
}

async fn pg_kafka_pipeline(
    side: Side,
    clock: Arc<Clock>,
    producers: PgPool,
    brokers: crate::kafka::Brokers,
) -> Pipeline {
    let prefix = format!("bench{}", Uuid::now_v7().simple());
    brokers.create_topic(&prefix).await;
    match side {
        Side::Hexeract => pg_kafka_hexeract(clock, producers, &brokers, &prefix).await,
        Side::Raw => pg_kafka_raw(clock, producers, &brokers, &prefix).await,
    }
}

async fn pg_kafka_hexeract(
    clock: Arc<Clock>,
    producers: PgPool,
    brokers: &crate::kafka::Brokers,
    prefix: &str,
) -> Pipeline {
    let pool = crate::outbox::connect().await;
    let schema = format!("bench_e2e_{}", Uuid::now_v7().simple());
    let store = PgStore::new(pool.clone(), &schema).expect("schema name");
    store.migrate().await.expect("migrate");
    let config = brokers.config(prefix);
    let shared: Arc<dyn hexeract::store::Store> = Arc::new(store.clone());
    let worker = hexeract::kafka::KafkaWorker::builder(config.clone(), shared.clone())
        .register_handler_with::<AccountCredited, _>(
            Record(clock),
            HandlerOptions::new().name(HANDLER),
        )
        .build()
        .expect("worker");
    let relay = hexeract::kafka::KafkaRelay::new(shared, &config)
        .expect("relay")
        .batch_size(RELAY_BATCH);
    let cancel = CancellationToken::new();
    let worker = tokio::spawn(worker.run(cancel.child_token()));
    let relay = tokio::spawn(relay.run(cancel.child_token()));
    let commit = enqueue_commit(producers, schema, |seq| {
        Envelope::new(&credit(seq)).expect("encode")
    });
    let stop = Box::pin(async move {
        cancel.cancel();
        worker.await.expect("join").expect("worker");
        relay.await.expect("join").expect("relay");
        crate::outbox::drop_schema(&pool, &store).await;
        pool.close().await;
    });
    Pipeline { commit, stop }
}

async fn pg_kafka_raw(
    clock: Arc<Clock>,
    producers: PgPool,
    brokers: &crate::kafka::Brokers,
    prefix: &str,
) -> Pipeline {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::message::Headers;
    use rdkafka::producer::FutureProducer;
    use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
    use rdkafka::{ClientConfig, Message as _};

    let outbox = Arc::new(RawOutbox::create(true).await);
    let topic = format!("{prefix}.account");
    let cancel = CancellationToken::new();

    // The relay: each batch produced (idempotent, acks=all), every acknowledgement awaited.
    let relay = {
        let (outbox, cancel) = (outbox.clone(), cancel.clone());
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &brokers.servers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "2")
            .set("batch.num.messages", brokers.batch)
            .create()
            .expect("producer");
        let publisher = ToKafka {
            producer,
            topic: topic.clone(),
        };
        tokio::spawn(async move { outbox.relay(cancel, publisher).await })
    };

    // The consumer: a group of its own, each record decoded and handled, its offset stored
    // (committed in the background).
    let consumer = {
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers.servers)
            .set("group.id", format!("{prefix}.raw"))
            .set("enable.auto.commit", "true")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .create()
            .expect("consumer");
        consumer.subscribe(&[&topic]).expect("subscribe");
        let (topic, cancel) = (topic.clone(), cancel.clone());
        let handler = Record(clock);
        tokio::spawn(async move {
            let context = Context::new(
                Envelope::new(&credit(0)).expect("encode"),
                HANDLER,
                CancellationToken::new(),
                Arc::new(hexeract::InMemoryStore::new()),
            );
            loop {
                let record = tokio::select! {
                    record = consumer.recv() => record.expect("a record"),
                    () = cancel.cancelled() => break,
                };
                let typed = record
                    .headers()
                    .and_then(|headers| headers.iter().find(|h| h.key == "ce_type"))
                    .and_then(|header| header.value)
                    == Some(AccountCredited::MESSAGE_TYPE.as_bytes());
                if typed {
                    let credit: AccountCredited =
                        serde_json::from_slice(record.payload().unwrap_or_default())
                            .expect("decode");
                    handler.handle(credit, &context).await.expect("infallible");
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
        })
    };

    let commit = outbox.commit(producers, |seq| {
        let credit = credit(seq);
        RawEvent {
            message_type: AccountCredited::MESSAGE_TYPE,
            key: Some(credit.account.to_string()),
            payload: serde_json::to_vec(&credit).expect("encode"),
        }
    });
    let stop = Box::pin(async move {
        cancel.cancel();
        relay.await.expect("relay");
        consumer.await.expect("consumer");
        Arc::into_inner(outbox)
            .expect("the relay ended")
            .drop()
            .await;
    });
    Pipeline { commit, stop }
}
