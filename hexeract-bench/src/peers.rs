//! Peers: Hexeract against other Rust libraries doing the same work on the same broker or
//! database, in the same process, in alternating runs (the side that goes first rotates), with
//! the medians printed as
//!
//! ```text
//! scenario=peer_<peer>_<work> hexeract=<msgs/s> baseline=<peer's msgs/s> ratio=<hexeract/peer> <settings> # <comment>
//! ```
//!
//! `ratio` is the median of the runs' ratios (as in `rabbitmq.rs`); the settings are the same on
//! both sides unless the line says otherwise. The peers, pinned in `Cargo.toml`:
//!
//! - **apalis** (`apalis` 1.0.0-rc.9 and `apalis-postgres` 1.0.0-rc.8), a job queue on
//!   PostgreSQL.
//!   - `peer_apalis_drain`: draining N pre-filled jobs with a no-op handler that counts, from the
//!     worker's start until the handler saw the last one. Hexeract's outbox worker
//!     (`outbox.rs`) against an apalis worker polling a `PostgresStorage` with the same pool
//!     (4 connections), the same batch (apalis' `buffer_size` = the outbox's `BATCH`) and the
//!     same JSON payload. apalis does less: it keeps every finished job as a row (status `Done`)
//!     instead of deleting it, has no dead letters (a job out of attempts stays in the table as
//!     `Killed`) and no fan-out to several handlers, and takes a job back from a worker only
//!     once the worker's heartbeat is 5 minutes old (no lease per claim). It also does more per
//!     job: a fetch marks a batch `Queued`, then every job is locked (`Running`) and
//!     acknowledged (`Done`) by a statement, and so a commit, of its own, where the outbox
//!     worker claims and acknowledges a whole batch at a time.
//!   - `peer_apalis_latency`: commit-to-handler latency of single jobs written one at a time,
//!     with each side woken by LISTEN/NOTIFY: Hexeract's outbox worker (as in
//!     `outbox_latency_woken`) against apalis' `PostgresStorage::new_with_notify`.
//!
//!   apalis' migrations create a schema of their own, `apalis`, with the name written into its
//!   SQL, so it cannot be namespaced: runs are isolated by a fresh queue name (`job_type`) each,
//!   whose rows are deleted after the run. The migrations' bookkeeping (`_sqlx_migrations`, the
//!   `pgcrypto` extension, `generate_ulid()`) goes to a schema of the benchmark's own,
//!   `hexeract_bench_apalis`, and both schemas are dropped at the end. An `apalis` schema that
//!   was already there without that one is someone else's: it is left alone and the apalis
//!   scenarios are skipped.
//!
//! - **ruststream** (`ruststream` 0.7.7 with `ruststream-lapin` 0.7.2), a messaging framework
//!   on RabbitMQ through lapin, as Hexeract.
//!   - `peer_ruststream_consume_prefetch16` / `_prefetch512`: draining a pre-filled durable
//!     quorum queue of persistent messages with manual acks: Hexeract's `RabbitMqWorker` (as in
//!     `rabbitmq_consume`) against a ruststream application with one subscriber (the runtime's
//!     default: one message at a time, each acked and the ack awaited) on a queue of the same
//!     shape with the same prefetch, and a no-op handler that counts. ruststream does less: no
//!     wait (retry) queues or parking queue behind its subscriber, where the worker declares
//!     and routes to both. Its figure includes opening its own connection, which the
//!     application does at start (the line gives how long its start took); Hexeract's worker is
//!     handed an open one.
//!   - `peer_ruststream_publish`: confirmed persistent publishing to a quorum queue bound to an
//!     exchange: Hexeract's `RabbitMqPublisher` (`publish_all` of 1 000 envelopes, at most 128
//!     confirms outstanding) against ruststream's confirms publisher, one owned transaction per
//!     1 000 messages (the commit publishes them all, then awaits every confirm: ruststream has
//!     no window). ruststream does less: its messages carry the delivery mode and nothing else,
//!     where Hexeract's carry an id, a type, a timestamp, a content type and a creation header.
//!   - `peer_ruststream_publish_metadata`: the same, each ruststream message carrying the same
//!     metadata through its headers (id and content type become AMQP properties, type and
//!     creation time header-table entries): the work both do.
//!
//! - **amqprs** (2.1.5), a second raw AMQP client, doing what the raw lapin baselines of
//!   `rabbitmq.rs` do: `peer_amqprs_consume` (prefetch 16) and `peer_amqprs_consume_prefetch512`
//!   drain the same kind of queue with manual acks coalesced with `multiple` every half window,
//!   and `peer_amqprs_publish` publishes the envelopes' payloads with Hexeract's properties
//!   written out by hand, at most 128 confirms outstanding. A raw client does less than any
//!   framework: no handler lookup, no envelope, no retry or dead-letter routing.
//!
//! Broker objects are declared under fresh names (`bench.<uuid>`, as in `rabbitmq.rs`) and
//! deleted after each round.
//!
//! `--scenario peer_<peer>_<work>` runs one of them, `--scenario peer_` all of them and nothing
//! else.

use std::collections::BTreeSet;
use std::hint::black_box;
use std::num::NonZeroU16;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use amqprs::channel::{
    BasicAckArguments, BasicCancelArguments, BasicConsumeArguments, BasicPublishArguments,
    BasicQosArguments, Channel as AmqprsChannel, ConfirmSelectArguments,
};
use amqprs::connection::{Connection as AmqprsConnection, OpenConnectionArguments};
use apalis::prelude::{BoxDynError, Data, TaskSink, WorkerBuilder, WorkerError};
use apalis_postgres::{Config as ApalisConfig, PostgresStorage};
use hexeract::rabbitmq::RabbitMqConnection;
use hexeract::{Envelope, Message};
use ruststream::ConnectedBroker as _;
use ruststream_lapin::prelude::{
    subscriber, AppInfo, Broker as _, Handle, HandlerOutcome, LapinBroker, LapinPublish,
    PublishExt as _, RabbitQueue, RustStream,
};
use sqlx::postgres::PgPoolOptions;
use sqlx::{ConnectOptions as _, PgPool};
use tokio::sync::{mpsc, Notify};
use uuid::Uuid;

use crate::outbox;
use crate::rabbitmq::{self, Place};

/// The payload on every side: the JSON of `outbox.rs`' `ItemShipped` and `rabbitmq.rs`'
/// `StockReserved` (the same three fields, in the same order).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Item {
    order_id: u64,
    sku: String,
    quantity: u32,
}

// ruststream's typed publish (`message(&item)`, which takes headers) wants the payload's
// destination form: none of its own, the call site names it.
impl ruststream::OutgoingDestination for Item {
    type Form = ruststream::CallerName;
}

// No typed header contract: the headers are a map the call site builds.
impl ruststream::MessageHeaders for Item {
    type Contract = ruststream::NoHeaders;
}

fn item(order_id: u64) -> Item {
    Item {
        order_id,
        sku: "SKU-0042".into(),
        quantity: 3,
    }
}

/// The payload on the wire, the same on both sides: its size over the ids of a run of
/// `messages`.
fn payload(messages: u64) -> String {
    let size = |order_id| serde_json::to_vec(&item(order_id)).expect("encode").len();
    format!("json:{}-{}B", size(0), size(messages.saturating_sub(1)))
}

/// Counts what a no-op handler saw, and says when the last expected one arrived.
#[derive(Debug)]
struct Counter {
    seen: AtomicU64,
    expected: u64,
    done: Notify,
}

impl Counter {
    fn new(expected: u64) -> Arc<Counter> {
        Arc::new(Counter {
            seen: AtomicU64::new(0),
            expected,
            done: Notify::new(),
        })
    }

    fn hit(&self) {
        if self.seen.fetch_add(1, Ordering::SeqCst) + 1 == self.expected {
            self.done.notify_one();
        }
    }
}

fn rate(messages: u64, elapsed: Duration) -> f64 {
    messages as f64 / elapsed.as_secs_f64()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// One throughput line: the medians of each side and of the runs' ratios.
fn report(scenario: &str, hexeract: &[f64], peer: &[f64], settings: &str, comment: &str) {
    let ratios: Vec<f64> = hexeract.iter().zip(peer).map(|(h, p)| h / p).collect();
    println!(
        "scenario={scenario} hexeract={:.0} baseline={:.0} ratio={:.3} {settings} # {comment}",
        median(hexeract.to_vec()),
        median(peer.to_vec()),
        median(ratios),
    );
}

/// The order of the two sides in run `pair`: Hexeract first in even runs, the peer in odd ones.
fn hexeract_first(pair: usize) -> [bool; 2] {
    if pair.is_multiple_of(2) {
        [true, false]
    } else {
        [false, true]
    }
}

/// Runs the peer scenario `only` names (all of them without it, or with `peer_`), on a runtime
/// worker as the other asynchronous scenarios.
pub(crate) async fn run(quick: bool, only: Option<&str>) {
    let wanted = |name: &str| only.is_none_or(|only| only == name || only == "peer_");
    let scale = if quick { 1 } else { 10 };
    let pairs = if quick { 3 } else { 5 };
    let drain = wanted("peer_apalis_drain");
    let latency = wanted("peer_apalis_latency");
    if drain || latency {
        let samples = if quick { 50 } else { 500 };
        tokio::spawn(apalis_scenarios(
            drain.then_some(10_000 * scale),
            latency.then_some(samples),
            pairs,
        ))
        .await
        .expect("join");
    }
    for (prefetch, ruststream_name, amqprs_name) in [
        (
            rabbitmq::PREFETCH,
            "peer_ruststream_consume_prefetch16",
            "peer_amqprs_consume",
        ),
        (
            rabbitmq::RAISED_PREFETCHES[1],
            "peer_ruststream_consume_prefetch512",
            "peer_amqprs_consume_prefetch512",
        ),
    ] {
        let mut sides = Vec::new();
        if wanted(ruststream_name) {
            sides.push(Side::Ruststream);
        }
        if wanted(amqprs_name) {
            sides.push(Side::Amqprs);
        }
        if !sides.is_empty() {
            tokio::spawn(consume(
                20_000 * scale,
                prefetch,
                sides,
                pairs,
                [ruststream_name, amqprs_name],
            ))
            .await
            .expect("join");
        }
    }
    let mut sides = Vec::new();
    if wanted("peer_ruststream_publish") {
        sides.push(Side::Ruststream);
    }
    if wanted("peer_amqprs_publish") {
        sides.push(Side::Amqprs);
    }
    if !sides.is_empty() {
        tokio::spawn(publish(20_000 * scale, sides, pairs))
            .await
            .expect("join");
    }
}

// ---------------------------------------------------------------------------------------------
// apalis

/// The schema apalis' migrations keep their bookkeeping in, instead of `public`.
const APALIS_META: &str = "hexeract_bench_apalis";

/// Installs apalis' tables for the run; `false` when an `apalis` schema that is not the
/// benchmark's is already there.
async fn install_apalis(pool: &PgPool) -> bool {
    let exists = |schema: &'static str| async move {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
        )
        .bind(schema)
        .fetch_one(pool)
        .await
        .expect("look up schema")
    };
    let meta = exists(APALIS_META).await;
    if exists("apalis").await && !meta {
        return false;
    }
    if meta {
        // Left over by a run of this benchmark that did not finish.
        remove_apalis(pool).await;
    }
    sqlx::query(&format!("CREATE SCHEMA {APALIS_META}"))
        .execute(pool)
        .await
        .expect("create schema");
    let url = std::env::var("BENCH_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let options: sqlx::postgres::PgConnectOptions = url.parse().expect("a postgres:// URL");
    let migrations = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(
            options
                .options([("search_path", APALIS_META)])
                .disable_statement_logging(),
        )
        .await
        .expect("connect");
    PostgresStorage::setup(&migrations)
        .await
        .expect("apalis migrations");
    migrations.close().await;
    true
}

async fn remove_apalis(pool: &PgPool) {
    for schema in ["apalis", APALIS_META] {
        sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .execute(pool)
            .await
            .expect("drop schema");
    }
}

/// A fresh apalis queue name: a run's own rows.
fn apalis_queue() -> String {
    format!("bench.peer.{}", Uuid::now_v7().simple())
}

fn apalis_config(queue: &str) -> ApalisConfig {
    ApalisConfig::new(queue).set_buffer_size(outbox::BATCH as usize)
}

/// Deletes a run's jobs (apalis keeps the finished ones) and its worker.
async fn clean_apalis(pool: &PgPool, queue: &str) {
    sqlx::query("DELETE FROM apalis.jobs WHERE job_type = $1")
        .bind(queue)
        .execute(pool)
        .await
        .expect("delete jobs");
    sqlx::query("DELETE FROM apalis.workers WHERE worker_type = $1")
        .bind(queue)
        .execute(pool)
        .await
        .expect("delete workers");
}

/// A fresh apalis queue holding `jobs` pending jobs, pushed 1 000 at a time as `outbox::filled`
/// fills its outbox.
async fn filled_apalis(pool: &PgPool, jobs: u64) -> String {
    let queue = apalis_queue();
    let mut storage = PostgresStorage::<Item>::new_with_config(pool, &apalis_config(&queue));
    let mut next = 0;
    while next < jobs {
        let batch: Vec<Item> = (next..jobs.min(next + 1_000)).map(item).collect();
        next += batch.len() as u64;
        storage.push_bulk(batch).await.expect("fill");
    }
    // Fresh statistics, as `outbox::filled` takes.
    sqlx::query("ANALYZE apalis.jobs")
        .execute(pool)
        .await
        .expect("analyze");
    queue
}

/// apalis' no-op handler.
async fn apalis_count(item: Item, counter: Data<Arc<Counter>>) -> Result<(), BoxDynError> {
    black_box(&item);
    counter.hit();
    Ok(())
}

/// An apalis worker draining `queue`: from its start until the handler saw every job.
async fn run_apalis(pool: &PgPool, queue: &str, jobs: u64) -> Duration {
    let counter = Counter::new(jobs);
    let storage = PostgresStorage::<Item>::new_with_config(pool, &apalis_config(queue));
    let worker = WorkerBuilder::new(format!("{queue}.worker"))
        .backend(storage)
        .data(counter.clone())
        .build(apalis_count);
    let stop = Arc::new(Notify::new());
    let stopped = stop.clone();
    let started = Instant::now();
    let running = tokio::spawn(worker.run_until(async move {
        stopped.notified().await;
        Ok::<(), WorkerError>(())
    }));
    counter.done.notified().await;
    let elapsed = started.elapsed();
    stop.notify_one();
    running.await.expect("join").expect("apalis worker");
    elapsed
}

async fn apalis_scenarios(drain: Option<u64>, latency: Option<usize>, pairs: usize) {
    let pool = outbox::connect().await;
    if !install_apalis(&pool).await {
        println!(
            "# peer_apalis_*: skipped, an `apalis` schema that is not the benchmark's is already \
             in this database"
        );
        return;
    }
    if let Some(jobs) = drain {
        apalis_drain(&pool, jobs, pairs).await;
    }
    if let Some(samples) = latency {
        apalis_latency(&pool, samples, pairs).await;
    }
    remove_apalis(&pool).await;
    pool.close().await;
}

/// Prints the `peer_apalis_drain` line.
async fn apalis_drain(pool: &PgPool, jobs: u64, pairs: usize) {
    let mut hexeract = Vec::new();
    let mut peer = Vec::new();
    for pair in 0..pairs {
        for hexeract_side in hexeract_first(pair) {
            if hexeract_side {
                let store = outbox::filled(pool, jobs).await;
                hexeract.push(rate(jobs, outbox::run_worker(store.clone(), jobs).await));
                outbox::drop_schema(pool, &store).await;
            } else {
                let queue = filled_apalis(pool, jobs).await;
                peer.push(rate(jobs, run_apalis(pool, &queue, jobs).await));
                clean_apalis(pool, &queue).await;
            }
        }
    }
    report(
        "peer_apalis_drain",
        &hexeract,
        &peer,
        &format!(
            "jobs={jobs} payload={} pool=4 batch={} pairs={pairs}",
            payload(jobs),
            outbox::BATCH
        ),
        "apalis keeps every finished job as a row (status Done) and has no dead letters; per job \
         it commits a lock and an ack statement of its own (synchronous_commit on: a WAL flush \
         each), the outbox worker claims and acks a whole batch at a time",
    );
}

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "bench.peer.Probe")]
struct Probe {}

async fn apalis_probe(_probe: Probe, handled: Data<Arc<Notify>>) -> Result<(), BoxDynError> {
    handled.notify_one();
    Ok(())
}

/// `samples` commit-to-handler latencies through an apalis worker on
/// `PostgresStorage::new_with_notify`, beside `outbox::probe_latencies`: each job is pushed
/// (written and committed) on the pool, then the clock starts.
async fn latency_apalis(pool: &PgPool, samples: usize) -> Vec<Duration> {
    let queue = apalis_queue();
    let storage = PostgresStorage::<Probe>::new_with_notify(pool, &apalis_config(&queue));
    let mut sink = storage.clone();
    let handled = Arc::new(Notify::new());
    let worker = WorkerBuilder::new(format!("{queue}.worker"))
        .backend(storage)
        .data(handled.clone())
        .build(apalis_probe);
    let stop = Arc::new(Notify::new());
    let stopped = stop.clone();
    let running = tokio::spawn(worker.run_until(async move {
        stopped.notified().await;
        Ok::<(), WorkerError>(())
    }));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut latencies = Vec::with_capacity(samples);
    for _ in 0..samples {
        sink.push(Probe {}).await.expect("push");
        let committed = Instant::now();
        handled.notified().await;
        latencies.push(committed.elapsed());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.notify_one();
    running.await.expect("join").expect("apalis worker");
    clean_apalis(pool, &queue).await;
    latencies
}

fn quantile_ms(latencies: &mut [Duration], quantile: f64) -> f64 {
    latencies.sort();
    let index = ((latencies.len() as f64 * quantile).ceil() as usize).clamp(1, latencies.len()) - 1;
    latencies[index].as_secs_f64() * 1_000.0
}

/// Prints the `peer_apalis_latency` line: `samples` on each side, taken in `pairs` alternating
/// rounds, each with a fresh worker.
async fn apalis_latency(pool: &PgPool, samples: usize, pairs: usize) {
    let mut hexeract = Vec::with_capacity(samples);
    let mut peer = Vec::with_capacity(samples);
    for pair in 0..pairs {
        let round = samples / pairs + usize::from(pair < samples % pairs);
        for hexeract_side in hexeract_first(pair) {
            if hexeract_side {
                hexeract.extend(outbox::probe_latencies(pool, round, false).await);
            } else {
                peer.extend(latency_apalis(pool, round).await);
            }
        }
    }
    println!(
        "scenario=peer_apalis_latency hexeract_p50_ms={:.2} hexeract_p99_ms={:.2} \
         baseline_p50_ms={:.2} baseline_p99_ms={:.2} samples={samples} pool=4 pairs={pairs} \
         # both woken by LISTEN/NOTIFY; apalis marks the notified job Queued, then locks it \
         Running, in two statements before its handler runs",
        quantile_ms(&mut hexeract, 0.50),
        quantile_ms(&mut hexeract, 0.99),
        quantile_ms(&mut peer, 0.50),
        quantile_ms(&mut peer, 0.99),
    );
}

// ---------------------------------------------------------------------------------------------
// RabbitMQ: ruststream and amqprs

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Hexeract,
    Ruststream,
    Amqprs,
}

/// ruststream's no-op handler.
struct RuststreamCount(Arc<Counter>);

impl Handle<Item> for RuststreamCount {
    async fn handle(
        &self,
        item: &Item,
        _outs: &(),
        _ctx: &mut ruststream_lapin::prelude::Context<'_>,
    ) -> Result<(), HandlerOutcome> {
        black_box(item);
        self.0.hit();
        Ok(())
    }
}

/// A ruststream application with one subscriber on `queue` draining it: from the application's
/// start until the handler saw every message. Also gives how long the start took.
async fn consume_ruststream(queue: &str, expected: u64, prefetch: u16) -> (Duration, Duration) {
    let counter = Counter::new(expected);
    let broker = LapinBroker::new(rabbitmq::url())
        .connection_name("hexeract-bench-peer-ruststream")
        .prefetch(NonZeroU16::new(prefetch).expect("a prefetch"));
    let source = RabbitQueue::new(queue);
    let count = RuststreamCount(counter.clone());
    let app =
        RustStream::new(AppInfo::new("hexeract-bench-peer", "0.1.0")).with_broker(broker, |b| {
            b.include(subscriber(source, count).build());
        });
    let started = Instant::now();
    let running = app.start().await.expect("ruststream start");
    let startup = started.elapsed();
    counter.done.notified().await;
    let elapsed = started.elapsed();
    running.shutdown().await.expect("ruststream shutdown");
    (elapsed, startup)
}

async fn connect_amqprs(name: &str) -> AmqprsConnection {
    let url = rabbitmq::url();
    let uri: lapin::uri::AMQPUri = url.parse().expect("an amqp:// URL");
    let arguments = OpenConnectionArguments::new(
        &uri.authority.host,
        uri.authority.port,
        &uri.authority.userinfo.username,
        &uri.authority.userinfo.password,
    )
    .virtual_host(&uri.vhost)
    .connection_name(&format!("hexeract-bench-{name}"))
    .finish();
    AmqprsConnection::open(&arguments)
        .await
        .unwrap_or_else(|error| panic!("cannot reach RabbitMQ with amqprs ({error})"))
}

/// amqprs draining `queue` as `rabbitmq.rs`' coalescing lapin baseline does: the prefetch,
/// manual acks with `multiple` every half window and at the end, each payload decoded.
async fn consume_amqprs(
    connection: &AmqprsConnection,
    queue: &str,
    expected: u64,
    prefetch: u16,
) -> Duration {
    let ack_every = u64::from(prefetch / 2).max(1);
    let started = Instant::now();
    let channel = connection.open_channel(None).await.expect("channel");
    channel
        .basic_qos(BasicQosArguments::new(0, prefetch, false))
        .await
        .expect("basic.qos");
    let tag = format!("hexeract-bench:{}", Uuid::now_v7().simple());
    let (tag, mut deliveries) = channel
        .basic_consume_rx(
            BasicConsumeArguments::new(queue, &tag)
                .manual_ack(true)
                .finish(),
        )
        .await
        .expect("basic.consume");
    let mut seen = 0u64;
    while seen < expected {
        let delivery = deliveries.recv().await.expect("the consumer ended");
        let deliver = delivery.deliver.expect("a delivery");
        let content = delivery.content.expect("a body");
        let item: Item = serde_json::from_slice(&content).expect("decode");
        black_box(item);
        seen += 1;
        if seen.is_multiple_of(ack_every) || seen == expected {
            channel
                .basic_ack(BasicAckArguments::new(deliver.delivery_tag(), true))
                .await
                .expect("ack");
        }
    }
    let elapsed = started.elapsed();
    let _ = channel.basic_cancel(BasicCancelArguments::new(&tag)).await;
    let _ = channel.close().await;
    elapsed
}

/// Prints `peer_ruststream_consume_prefetch<N>` and `peer_amqprs_consume[_prefetch<N>]` (those
/// of `sides`). Each round fills fresh queues at once (the worker's whole topology, and one
/// quorum queue of the same shape per peer), then drains them one after the other, starting with
/// a different side each round.
async fn consume(messages: u64, prefetch: u16, peers: Vec<Side>, pairs: usize, names: [&str; 2]) {
    let setup = rabbitmq::connect("setup").await;
    let connection = rabbitmq::connect("peer-consume-hexeract").await;
    let amqprs = connect_amqprs("peer-consume-amqprs").await;
    let batch = rabbitmq::envelopes(messages);
    let mut sides = vec![Side::Hexeract];
    sides.extend(peers.iter().copied());
    let mut hexeract = Vec::new();
    let mut ruststream = Vec::new();
    let mut startups = Vec::new();
    let mut raw = Vec::new();
    for round in 0..pairs {
        let mut worker = Some(rabbitmq::consume_worker(
            &connection,
            &rabbitmq::fresh_prefix(),
            messages,
            prefetch,
        ));
        let places: Vec<Place> = sides
            .iter()
            .map(|side| match side {
                Side::Hexeract => Place::whole(worker.as_ref().expect("not run yet").0.topology()),
                Side::Ruststream | Side::Amqprs => {
                    Place::handler_queue(&rabbitmq::topology(&rabbitmq::fresh_prefix()))
                }
            })
            .collect();
        for place in &places {
            place.declare(&setup).await;
        }
        futures_util::future::join_all(
            places
                .iter()
                .map(|place| rabbitmq::preload(&setup, &place.queue, &batch)),
        )
        .await;
        tokio::time::sleep(rabbitmq::SETTLE).await;
        for at in 0..sides.len() {
            let at = (at + round) % sides.len();
            let queue = &places[at].queue;
            match sides[at] {
                Side::Hexeract => {
                    let (worker, done) = worker.take().expect("run once");
                    hexeract.push(rate(messages, rabbitmq::run_worker(worker, done).await));
                }
                Side::Ruststream => {
                    let (elapsed, startup) = consume_ruststream(queue, messages, prefetch).await;
                    ruststream.push(rate(messages, elapsed));
                    startups.push(startup.as_secs_f64() * 1_000.0);
                }
                Side::Amqprs => {
                    raw.push(rate(
                        messages,
                        consume_amqprs(&amqprs, queue, messages, prefetch).await,
                    ));
                }
            }
        }
        for place in &places {
            place.delete(&setup).await;
        }
    }
    let settings = format!(
        "messages={messages} prefetch={prefetch} queue=quorum persistent=true payload={} \
         pairs={pairs}",
        payload(messages)
    );
    if !ruststream.is_empty() {
        report(
            names[0],
            &hexeract,
            &ruststream,
            &settings,
            &format!(
                "ruststream: one subscriber, its default of one message at a time, each ack \
                 awaited; its time includes its start ({:.1} ms median: connection, channel, \
                 consume), Hexeract's worker gets an open connection; no wait queues or parking \
                 queue behind it",
                median(startups)
            ),
        );
    }
    if !raw.is_empty() {
        report(
            names[1],
            &hexeract,
            &raw,
            &settings,
            "amqprs: a raw loop, acks coalesced with multiple every half window (as \
             rabbitmq_consume's lapin baseline); no envelope, handler lookup or retry routing",
        );
    }
    let _ = amqprs.close().await;
    let _ = connection.close().await;
    let _ = setup.close().await;
}

/// ruststream's confirms publisher sending `messages` to a fresh exchange and queue: one owned
/// transaction per `PUBLISH_BATCH` messages, each commit publishing its batch and awaiting every
/// confirm. With `metadata`, each message also carries what Hexeract's envelope of the same
/// message carries: its id and content type as AMQP properties, its type and creation time as
/// headers (ruststream sets no `type` or `timestamp` property).
async fn publish_ruststream(
    setup: &RabbitMqConnection,
    broker: &ruststream_lapin::ConnectedLapinBroker,
    items: &[Item],
    routing_key: &str,
    metadata: Option<&[Envelope]>,
) -> Duration {
    let place = Place::handler_queue(&rabbitmq::topology(&rabbitmq::fresh_prefix()));
    place.declare(setup).await;
    let publisher = broker.publisher(
        LapinPublish::default()
            .exchange(place.exchange.clone())
            .confirms(),
    );
    let started = Instant::now();
    for (at, batch) in items.chunks(rabbitmq::PUBLISH_BATCH).enumerate() {
        let mut transaction = publisher.owned_transaction().await.expect("transaction");
        match metadata {
            None => {
                for item in batch {
                    transaction
                        .publish(routing_key, item)
                        .await
                        .expect("publish");
                }
            }
            Some(envelopes) => {
                let envelopes = &envelopes[at * rabbitmq::PUBLISH_BATCH..];
                for (item, envelope) in batch.iter().zip(envelopes) {
                    transaction
                        .message(item)
                        .with_headers(envelope_headers(envelope))
                        .to(routing_key)
                        .publish()
                        .await
                        .expect("publish");
                }
            }
        }
        transaction.commit().await.expect("commit");
    }
    let elapsed = started.elapsed();
    drop(publisher);
    place.delete(setup).await;
    elapsed
}

/// What Hexeract writes into a message's AMQP properties, as ruststream headers: `message-id`
/// and `content-type` become the properties of those names, the rest header-table entries.
fn envelope_headers(envelope: &Envelope) -> ruststream::HeaderMap {
    let mut headers = ruststream::HeaderMap::new();
    headers.insert("message-id", envelope.id.to_string());
    headers.insert("content-type", "application/json");
    headers.insert("type", envelope.message_type.clone());
    headers.insert(
        hexeract::rabbitmq::headers::CREATED_AT,
        envelope
            .created_at
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    );
    for (name, value) in &envelope.headers {
        headers.insert(name.clone(), value.clone());
    }
    headers
}

/// Forwards an amqprs channel's publisher confirms: (delivery tag, multiple, ack).
struct Confirms(mpsc::UnboundedSender<(u64, bool, bool)>);

#[async_trait::async_trait]
impl amqprs::callbacks::ChannelCallback for Confirms {
    async fn close(
        &mut self,
        _channel: &AmqprsChannel,
        _close: amqprs::CloseChannel,
    ) -> Result<(), amqprs::error::Error> {
        Ok(())
    }

    async fn cancel(
        &mut self,
        _channel: &AmqprsChannel,
        _cancel: amqprs::Cancel,
    ) -> Result<(), amqprs::error::Error> {
        Ok(())
    }

    async fn flow(
        &mut self,
        _channel: &AmqprsChannel,
        active: bool,
    ) -> Result<bool, amqprs::error::Error> {
        Ok(active)
    }

    async fn publish_ack(&mut self, _channel: &AmqprsChannel, ack: amqprs::Ack) {
        let _ = self.0.send((ack.delivery_tag(), ack.mutiple(), true));
    }

    async fn publish_nack(&mut self, _channel: &AmqprsChannel, nack: amqprs::Nack) {
        let _ = self.0.send((nack.delivery_tag(), nack.multiple(), false));
    }

    async fn publish_return(
        &mut self,
        _channel: &AmqprsChannel,
        _ret: amqprs::Return,
        _properties: amqprs::BasicProperties,
        _content: Vec<u8>,
    ) {
    }
}

/// The publishes of an amqprs confirm channel not confirmed yet.
struct AmqprsWindow {
    confirms: mpsc::UnboundedReceiver<(u64, bool, bool)>,
    outstanding: BTreeSet<u64>,
    next_tag: u64,
}

impl AmqprsWindow {
    /// Takes one confirm off the channel, waiting for it.
    async fn confirmed(&mut self) {
        let (tag, multiple, ack) = self.confirms.recv().await.expect("the channel closed");
        assert!(ack, "nacked");
        if multiple {
            self.outstanding = self.outstanding.split_off(&(tag + 1));
        } else {
            self.outstanding.remove(&tag);
        }
    }
}

/// What Hexeract puts on the wire for an envelope (`rabbitmq.rs`' `properties`), in amqprs'
/// types.
fn amqprs_properties(envelope: &Envelope) -> amqprs::BasicProperties {
    let text = |value: &str| amqprs::FieldValue::S(value.try_into().expect("a long string"));
    let mut table = amqprs::FieldTable::new();
    for (name, value) in &envelope.headers {
        table.insert(name.clone().try_into().expect("a header name"), text(value));
    }
    table.insert(
        hexeract::rabbitmq::headers::CREATED_AT
            .to_owned()
            .try_into()
            .expect("a header name"),
        text(
            &envelope
                .created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        ),
    );
    amqprs::BasicProperties::default()
        .with_message_id(&envelope.id.to_string())
        .with_content_type("application/json")
        .with_delivery_mode(amqprs::DELIVERY_MODE_PERSISTENT)
        .with_timestamp(u64::try_from(envelope.created_at.timestamp()).unwrap_or(0))
        .with_headers(table)
        .with_message_type(&envelope.message_type)
        .finish()
}

/// amqprs publishing `messages` to a fresh exchange and queue as `rabbitmq.rs`' raw lapin
/// publisher does: at most `CONFIRM_WINDOW` confirms outstanding, then every one awaited.
async fn publish_amqprs(
    setup: &RabbitMqConnection,
    connection: &AmqprsConnection,
    messages: &[Envelope],
) -> Duration {
    let place = Place::handler_queue(&rabbitmq::topology(&rabbitmq::fresh_prefix()));
    place.declare(setup).await;
    let channel = connection.open_channel(None).await.expect("channel");
    let (sender, confirms) = mpsc::unbounded_channel();
    channel
        .register_callback(Confirms(sender))
        .await
        .expect("callback");
    channel
        .confirm_select(ConfirmSelectArguments::default())
        .await
        .expect("confirm.select");
    let mut window = AmqprsWindow {
        confirms,
        outstanding: BTreeSet::new(),
        next_tag: 0,
    };
    let started = Instant::now();
    for envelope in messages {
        while window.outstanding.len() >= rabbitmq::CONFIRM_WINDOW {
            window.confirmed().await;
        }
        channel
            .basic_publish(
                amqprs_properties(envelope),
                envelope.payload.to_vec(),
                BasicPublishArguments::new(&place.exchange, &envelope.message_type),
            )
            .await
            .expect("publish");
        window.next_tag += 1;
        window.outstanding.insert(window.next_tag);
    }
    while !window.outstanding.is_empty() {
        window.confirmed().await;
    }
    let elapsed = started.elapsed();
    let _ = channel.close().await;
    place.delete(setup).await;
    elapsed
}

/// Prints `peer_ruststream_publish` and `peer_amqprs_publish` (those of `peers`): in each pair
/// every side publishes the same messages once, the side that goes first rotating.
async fn publish(messages: u64, peers: Vec<Side>, pairs: usize) {
    let setup = rabbitmq::connect("setup").await;
    let connection = rabbitmq::connect("peer-publish-hexeract").await;
    let broker = LapinBroker::new(rabbitmq::url())
        .connection_name("hexeract-bench-peer-publish-ruststream")
        .connect()
        .await
        .expect("ruststream connect");
    let amqprs = connect_amqprs("peer-publish-amqprs").await;
    let batch = rabbitmq::envelopes(messages);
    let routing_key = batch[0].message_type.clone();
    let items: Vec<Item> = (0..messages).map(item).collect();
    let mut sides = vec![Side::Hexeract];
    sides.extend(peers.iter().copied());
    let mut hexeract = Vec::new();
    // At ruststream's number of confirms outstanding: a whole batch.
    let mut hexeract_wide = Vec::new();
    let mut ruststream = Vec::new();
    let mut ruststream_metadata = Vec::new();
    let mut raw = Vec::new();
    for round in 0..pairs {
        for at in 0..sides.len() {
            match sides[(at + round) % sides.len()] {
                Side::Hexeract => {
                    hexeract.push(rate(
                        messages,
                        rabbitmq::publish_hexeract(&setup, &connection, &batch).await,
                    ));
                    if peers.contains(&Side::Ruststream) {
                        hexeract_wide.push(rate(
                            messages,
                            rabbitmq::publish_hexeract_within(
                                &setup,
                                &connection,
                                &batch,
                                rabbitmq::PUBLISH_BATCH,
                            )
                            .await,
                        ));
                    }
                }
                Side::Ruststream => {
                    ruststream.push(rate(
                        messages,
                        publish_ruststream(&setup, &broker, &items, &routing_key, None).await,
                    ));
                    ruststream_metadata.push(rate(
                        messages,
                        publish_ruststream(&setup, &broker, &items, &routing_key, Some(&batch))
                            .await,
                    ));
                }
                Side::Amqprs => raw.push(rate(
                    messages,
                    publish_amqprs(&setup, &amqprs, &batch).await,
                )),
            }
        }
    }
    let settings = format!(
        "messages={messages} queue=quorum persistent=true payload={} pairs={pairs}",
        payload(messages)
    );
    if !ruststream.is_empty() {
        report(
            "peer_ruststream_publish",
            &hexeract_wide,
            &ruststream,
            &format!(
                "{settings} batch={0} outstanding={0}",
                rabbitmq::PUBLISH_BATCH,
            ),
            "ruststream: one owned confirms transaction per batch, whose commit publishes all \
             of it, then awaits every confirm; Hexeract's publish_all of the same batch with a \
             confirm window of the batch's size; ruststream's messages carry the delivery mode \
             only, Hexeract's also an id, a type, a timestamp, a content type and a header",
        );
        report(
            "peer_ruststream_publish_metadata",
            &hexeract_wide,
            &ruststream_metadata,
            &format!(
                "{settings} batch={0} outstanding={0}",
                rabbitmq::PUBLISH_BATCH,
            ),
            "the same, each ruststream message carrying what Hexeract's does: its id and \
             content type as properties, its type and creation time as headers (ruststream has \
             no type or timestamp property); the work both do",
        );
    }
    if !raw.is_empty() {
        report(
            "peer_amqprs_publish",
            &hexeract,
            &raw,
            &format!(
                "{settings} hexeract_batch={} window={}",
                rabbitmq::PUBLISH_BATCH,
                rabbitmq::CONFIRM_WINDOW
            ),
            "amqprs: a raw loop over the same envelopes with Hexeract's properties written out, \
             confirms tracked from its channel callback (as rabbitmq_publish's lapin baseline)",
        );
    }
    let _ = broker.shutdown().await;
    let _ = amqprs.close().await;
    let _ = connection.close().await;
    let _ = setup.close().await;
}
